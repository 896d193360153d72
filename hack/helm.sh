#!/usr/bin/env bash
# Prints the path of a helm binary, building it from its Go module the first
# time (no release binary can be downloaded here) and caching it in bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM_VERSION=${HELM_VERSION:-v4.3.1}
out=$PWD/bin/helm-$HELM_VERSION
if [[ ! -x $out ]]; then
  echo "building helm $HELM_VERSION (once; cached in bin/)" >&2
  tmp=$PWD/bin/helm-tmp
  GOBIN=$tmp CGO_ENABLED=0 go install -trimpath \
    -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  mv "$tmp/helm" "$out" && rmdir "$tmp"
fi
echo "$out"
