#!/usr/bin/env bash
# Route benchmark in the style of seed 004: 300 concurrent request/response
# clients in Hong Kong, DURATION per path, to a target in US-East, directly,
# through the report's static chain, and through sum and pipe chains, over
# emulated links with the report's latencies (internal/testing/seed004, internal/linkemu).
# Writes its table into docs/benchmarks.md between the route markers.
# Needs root (network namespaces, TUN devices).
#
#   hack/bench/route.sh                       # 60 s per path, about 5 minutes
#   DURATION=15s hack/bench/route.sh          # a quick look
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-60s}
CLIENTS=${CLIENTS:-300}
INTERVAL=${INTERVAL:-2s}
OUT=${OUT:-docs/benchmarks.md}

if ! command -v ip >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2
fi
make -s build
go build -o bin/routebench ./hack/bench/routebench
bin/routebench -hoplink bin/hoplink -clients "$CLIENTS" -duration "$DURATION" -interval "$INTERVAL" -out "$OUT"
