#!/usr/bin/env bash
# A release, offline: static hoplink binaries for linux/amd64 and
# linux/arm64, the container image saved as a tarball (where a Docker
# engine answers; with CI set, it must), and SHA256SUMS of them all.
#
#   make dist                              # into dist/, VERSION from git describe
#   DIST=out VERSION=v0.9.0 hack/dist.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
DIST=${DIST:-dist}
mkdir -p "$DIST"
rm -f "$DIST"/hoplink-* "$DIST"/SHA256SUMS
for arch in amd64 arm64; do
  out="$DIST/hoplink-$VERSION-linux-$arch"
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch "${GO:-go}" build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$out" ./cmd/hoplink
  echo "dist: $out"
done
if docker info >/dev/null 2>&1; then
  # The image of the engine's architecture, from the binary above.
  arch=$(docker version -f '{{.Server.Arch}}')
  IMAGE="hoplink:$VERSION" BINARY="$DIST/hoplink-$VERSION-linux-$arch" hack/docker-build.sh
  docker save "hoplink:$VERSION" | gzip -n >"$DIST/hoplink-image-$VERSION-linux-$arch.tar.gz"
  echo "dist: $DIST/hoplink-image-$VERSION-linux-$arch.tar.gz"
elif [[ -n ${CI:-} ]]; then
  echo "dist: no Docker engine answers, and CI wants the image: run hack/dockerd.sh first (as root)" >&2
  exit 2
else
  echo "dist: no Docker engine answers here, so no image (hack/dockerd.sh starts one, as root); the binaries are built" >&2
fi
(cd "$DIST" && sha256sum hoplink-* >SHA256SUMS)
echo "dist: $DIST/SHA256SUMS"
