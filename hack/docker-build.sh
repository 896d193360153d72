#!/usr/bin/env bash
# Builds the hoplink image (FROM scratch, static binary) where a Docker engine
# runs. IMAGE names it (default hoplink:dev); BINARY, when set, is the static
# linux binary to put in it (make dist's), else one is built for the host.
#
#   hack/docker-build.sh && kubectl apply -k config/default
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-hoplink:dev}
if ! command -v docker >/dev/null || ! docker info >/dev/null 2>&1; then
  echo "docker-build: no Docker engine answers here; hack/dockerd.sh starts one (as root), then run again" >&2
  exit 2
fi
mkdir -p bin/image
if [[ -n ${BINARY:-} ]]; then
  cp "$BINARY" bin/image/hoplink
else
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)" \
    -o bin/image/hoplink ./cmd/hoplink
fi
docker build -t "$IMAGE" -f Dockerfile .
echo "built $IMAGE"
