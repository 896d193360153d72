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
. hack/lib/k8s-module.sh

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
  K8S_SRC=$src
  k8s_module "$src" "$K8S_VERSION"
  k8s_build "$dest" "$K8S_VERSION" kube-apiserver
  cd "$root"
  rm -rf "$src/kubernetes"
fi

if [[ ! -x $dest/etcd ]]; then
  log "building etcd v$ETCD_VERSION from Go modules (about 40 s, once)"
  etcd_build "$dest" "$ETCD_VERSION" "$src"
fi

echo "$dest"
