# Sourced by scripts that build Kubernetes binaries from the k8s.io/kubernetes
# Go module (no release binary can be downloaded here).
#
#   k8s_module SRC VERSION   copies the module to SRC/kubernetes and makes it
#                            build outside the kubernetes repository
#   k8s_build DEST VERSION CMD...  builds ./cmd/CMD into DEST/CMD (static)

k8s_module() {
  local src=$1 version=$2 moddir staging
  moddir=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [[ -d $moddir ]] || { echo "go mod download k8s.io/kubernetes@v$version failed" >&2; return 1; }
  rm -rf "$src/kubernetes" && mkdir -p "$src"
  cp -r "$moddir" "$src/kubernetes"
  chmod -R u+w "$src/kubernetes"
  # The module points k8s.io/* at ./staging through replace directives and
  # v0.0.0 requires, which only work inside the kubernetes repository: use
  # the published staging modules.
  rm -rf "$src/kubernetes/vendor" "$src/kubernetes/go.work" "$src/kubernetes/go.work.sum"
  staging="v0.${version#1.}"
  python3 - "$staging" "$src/kubernetes/go.mod" <<'PY'
import re, sys
staging, path = sys.argv[1], sys.argv[2]
mod = open(path).read()
mod = re.sub(r"\nreplace \((.|\n)*?\n\)\n", "\n", mod)
mod = re.sub(r"(?m)^(\s*k8s\.io/[\w./-]+) v0\.0\.0$", r"\1 " + staging, mod)
open(path, "w").write(mod)
PY
}

k8s_build() {
  local dest=$1 version=$2 minor cmd
  shift 2
  minor=${version#1.}; minor=${minor%%.*}
  mkdir -p "$dest"
  for cmd in "$@"; do
    (cd "$K8S_SRC/kubernetes" && GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -o "$dest/$cmd.tmp" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=v$version \
      -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      "./cmd/$cmd") && mv "$dest/$cmd.tmp" "$dest/$cmd"
  done
}

# etcd_build DEST VERSION SRC: etcd's own replace directives stop `go
# install`; a wrapper module resolves it normally.
etcd_build() {
  local dest=$1 version=$2 src=$3
  rm -rf "$src/etcd" && mkdir -p "$src/etcd" "$dest"
  (cd "$src/etcd" && go mod init hoplink.local/etcd >/dev/null 2>&1 &&
    GOFLAGS=-mod=mod GOTOOLCHAIN=local go get "go.etcd.io/etcd/server/v3@v$version" >/dev/null 2>&1 &&
    GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dest/etcd.tmp" go.etcd.io/etcd/server/v3) &&
    mv "$dest/etcd.tmp" "$dest/etcd"
  rm -rf "$src/etcd"
}
