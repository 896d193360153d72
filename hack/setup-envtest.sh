#!/usr/bin/env bash
# Builds the control plane that envtest runs (kube-apiserver and etcd) from Go modules, because
# no release binary can be downloaded here, and caches it under bin/k8s/VERSION. Prints that
# directory, which is what KUBEBUILDER_ASSETS wants. A warm run only checks the cache.
#
#   export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)
#
# Cold cost on 2 cores: about 6 minutes (kube-apiserver) plus 40 s (etcd), ~6.5 GB of Go build cache.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

K8S_VERSION=${K8S_VERSION:-1.37.1}   # k8s.io/kubernetes; its staging modules are published as v0.37.x
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
dest=$root/bin/k8s/$K8S_VERSION
src=$root/bin/k8s/src
log() { printf '%s\n' "setup-envtest: $*" >&2; }

if [[ -x $dest/kube-apiserver && -x $dest/etcd ]]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$dest" "$src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local

if [[ ! -x $dest/kube-apiserver ]]; then
  log "building kube-apiserver v$K8S_VERSION from the k8s.io/kubernetes module (about 6 minutes, once)"
  moddir=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [[ -d $moddir ]] || { log "go mod download k8s.io/kubernetes@v$K8S_VERSION failed"; exit 1; }
  rm -rf "$src/kubernetes"
  cp -r "$moddir" "$src/kubernetes"
  chmod -R u+w "$src/kubernetes"
  cd "$src/kubernetes"
  # The module points k8s.io/* at ./staging through replace directives and v0.0.0 requires,
  # which only work inside the kubernetes repository: use the published staging modules.
  rm -rf vendor go.work go.work.sum
  staging="v0.${K8S_VERSION#1.}"
  python3 - "$staging" <<'EOF'
import re, sys
staging = sys.argv[1]
mod = open("go.mod").read()
mod = re.sub(r"\nreplace \((.|\n)*?\n\)\n", "\n", mod)
mod = re.sub(r"(?m)^(\s*k8s\.io/[\w./-]+) v0\.0\.0$", r"\1 " + staging, mod)
open("go.mod", "w").write(mod)
EOF
  minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  CGO_ENABLED=0 go build -trimpath -o "$dest/kube-apiserver.tmp" -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    ./cmd/kube-apiserver
  mv "$dest/kube-apiserver.tmp" "$dest/kube-apiserver"
  cd "$root"
  rm -rf "$src/kubernetes"
fi

if [[ ! -x $dest/etcd ]]; then
  log "building etcd v$ETCD_VERSION from Go modules (about 40 s, once)"
  # etcd's own replace directives stop `go install`; a wrapper module resolves it normally.
  rm -rf "$src/etcd" && mkdir -p "$src/etcd" && cd "$src/etcd"
  go mod init hoplink.local/etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dest/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$dest/etcd.tmp" "$dest/etcd"
  cd "$root"
  rm -rf "$src/etcd"
fi

echo "$dest"
