#!/usr/bin/env bash
# Builds what a kind node runs, from Go modules, into bin/kind/VERSION-DIRS:
# the Kubernetes binaries, etcd, CoreDNS, a pause binary and kind itself.
# Each is built once and cached. Prints nothing; node-image.sh calls it.
# Cold cost on 2 cores: about 12 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
. hack/lib/k8s-module.sh

K8S_VERSION=${K8S_VERSION:-1.37.1}
ETCD_VERSION=${ETCD_VERSION:-3.7.0}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.6}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
out=$root/bin/kind
src=$out/src
log() { printf 'kind/binaries: %s\n' "$*" >&2; }

k8s=$out/k8s-$K8S_VERSION
cmds=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
missing=()
for c in "${cmds[@]}"; do [[ -x $k8s/$c ]] || missing+=("$c"); done
if ((${#missing[@]})); then
  log "building ${missing[*]} v$K8S_VERSION (about 9 minutes, once)"
  K8S_SRC=$src
  k8s_module "$src" "$K8S_VERSION"
  k8s_build "$k8s" "$K8S_VERSION" "${missing[@]}"
  rm -rf "$src/kubernetes"
fi
if [[ ! -x $out/etcd-$ETCD_VERSION/etcd ]]; then
  log "building etcd v$ETCD_VERSION"
  etcd_build "$out/etcd-$ETCD_VERSION" "$ETCD_VERSION" "$src"
fi
gobin() { # gobin DIR MODULE@VERSION: go install into DIR
  local dir=$1 pkg=$2
  mkdir -p "$dir"
  GOBIN=$dir CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local go install -trimpath -ldflags "-s -w" "$pkg"
}
if [[ ! -x $out/coredns-$COREDNS_VERSION/coredns ]]; then
  log "building coredns v$COREDNS_VERSION (about 3 minutes, once)"
  gobin "$out/coredns-$COREDNS_VERSION" "github.com/coredns/coredns@v$COREDNS_VERSION"
fi
if [[ ! -x $out/kind-$KIND_VERSION/kind ]]; then
  log "building kind $KIND_VERSION"
  gobin "$out/kind-$KIND_VERSION" "sigs.k8s.io/kind@$KIND_VERSION"
fi
mkdir -p "$out/tools"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/tools/pause" ./hack/kind/pause
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/tools/runcshim" ./hack/kind/runcshim
