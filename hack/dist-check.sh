#!/usr/bin/env bash
# Checks the install paths docs/standalone.md gives, as a user meets them
# (CI runs it after make dist, with a Docker engine up):
#   - go install of the command, which reports a version;
#   - make dist's output: checksums that match, static linux binaries of
#     both architectures carrying the version, the host's one running;
#   - the image: loaded from its tarball, it runs as 65532 and reports
#     the version; and the docker run command of docs/standalone.md, run
#     on a relay's files laid out as the doc says, serves until ready and
#     stops cleanly. Without an engine (and without CI) the image part is
#     skipped, saying so.
#
#   make dist VERSION=v0.9.0 && hack/dist-check.sh dist v0.9.0
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${1:-dist}
VERSION=${2:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
GO=${GO:-go}
work=$(mktemp -d)
container=""
cleanup() {
  [[ -n $container ]] && docker rm -f "$container" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "dist-check: $*" >&2; exit 1; }

# go install, as docs/standalone.md says (from this checkout: the module
# proxy may not have this commit).
GOBIN="$work/gobin" "$GO" install ./cmd/hoplink
"$work/gobin/hoplink" --version | grep -q '^hoplink ' || fail "go install: the binary does not say its version"
echo "dist-check: go install ok: $("$work/gobin/hoplink" --version)"

# make dist's files.
[[ -f $DIST/SHA256SUMS ]] || fail "$DIST/SHA256SUMS missing: run make dist VERSION=$VERSION first"
(cd "$DIST" && sha256sum --check --quiet SHA256SUMS) || fail "$DIST: checksums do not match"
for arch in amd64 arm64; do
  bin="$DIST/hoplink-$VERSION-linux-$arch"
  [[ -x $bin ]] || fail "$bin missing"
  grep -q " hoplink-$VERSION-linux-$arch\$" "$DIST/SHA256SUMS" || fail "$bin is not in SHA256SUMS"
  info=$("$GO" version -m "$bin")
  for want in "GOOS=linux" "GOARCH=$arch" "CGO_ENABLED=0"; do
    grep -q "build	$want" <<<"$info" || fail "$bin: built without $want (static linux binaries only)"
  done
  grep -aq -- "$VERSION" "$bin" || fail "$bin does not carry the version $VERSION"
done
host=$("$GO" env GOARCH)
"$DIST/hoplink-$VERSION-linux-$host" --version | grep -q "^hoplink $VERSION " || fail "the $host binary does not report $VERSION"
echo "dist-check: $DIST ok"

if ! docker info >/dev/null 2>&1; then
  [[ -n ${CI:-} ]] && fail "no Docker engine answers, and CI checks the image: run hack/dockerd.sh first"
  echo "dist-check: no Docker engine answers here: the image and docker run are not checked (hack/dockerd.sh starts one)" >&2
  exit 0
fi
arch=$(docker version -f '{{.Server.Arch}}')
tarball="$DIST/hoplink-image-$VERSION-linux-$arch.tar.gz"
[[ -f $tarball ]] || fail "$tarball missing: make dist ran without an engine?"
docker load <"$tarball" >/dev/null
image="hoplink:$VERSION"
[[ $(docker image inspect -f '{{.Config.User}}' "$image") == 65532:65532 ]] || fail "$image does not run as 65532:65532"
docker run --rm "$image" --version | grep -q "^hoplink $VERSION " || fail "$image does not report $VERSION"

# The doc's docker run, on a relay's files laid out as the doc says, under
# a directory of our own instead of /etc/hoplink.
cmd=$(awk '/<!-- hack\/dist-check.sh runs this command -->/ {found=1; next}
  found && /^```sh/ {inblock=1; next}
  inblock && /^```/ {exit}
  inblock {sub(/\\$/, ""); printf "%s ", $0}' docs/standalone.md)
[[ $cmd == "docker run "* ]] || fail "docs/standalone.md: no docker run command after its marker"
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(freeport)
metrics=$(freeport)
etc="$work/etc-hoplink"
mkdir -p "$etc/manifests"
cat >"$etc/manifests/relays.yaml" <<YAML
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: $port}}
YAML
"$DIST/hoplink-$VERSION-linux-$host" cert ca --certs "$etc/certs" >/dev/null
"$DIST/hoplink-$VERSION-linux-$host" cert issue --certs "$etc/certs" hk >/dev/null
rm "$etc/certs/ca.key" # a relay's host holds no CA key
chown 65532 "$etc/certs/hk.key" # as the doc says
chmod 0755 "$work"
container="hoplink-dist-check-$$"
cmd=${cmd//\/etc\/hoplink/$etc}
cmd=${cmd//hoplink:v0.9.0/$image}
cmd=${cmd//--name hoplink-hk/--name $container}
cmd=${cmd//127.0.0.1:9464/127.0.0.1:$metrics}
echo "dist-check: $cmd"
eval "$cmd" >/dev/null
for i in $(seq 60); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$metrics/readyz', timeout=1)" 2>/dev/null; then
    break
  fi
  [[ $i == 60 ]] && { docker logs "$container" >&2; fail "the relay of docker run did not turn ready in 30 s"; }
  sleep 0.5
done
docker kill -s HUP "$container" >/dev/null
sleep 1
docker logs "$container" 2>&1 | grep -q 'manifests reloaded' || { docker logs "$container" >&2; fail "docker kill -s HUP did not reload"; }
docker stop "$container" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$container")
[[ $code == 0 ]] || { docker logs "$container" >&2; fail "docker stop: exit code $code"; }
echo "dist-check: image $image and the docs' docker run ok"
