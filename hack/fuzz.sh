#!/usr/bin/env bash
# Runs every fuzz target for a number of executions, not a duration: Go 1.26's
# fuzz coordinator can fail a target with "context deadline exceeded" when a
# -fuzztime duration ends while a worker is mid-call (go.dev/issue/75804, fixed
# in 1.27). A count has no deadline to race. The counts below are about ten
# seconds each on 2 cores; FUZZSCALE multiplies them (make fuzz FUZZSCALE=6).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${FUZZSCALE:-1}
go=${GO:-go}

# package            target               executions at scale 1
targets=(
  "./relay/hop        FuzzParse            700000"
  "./relay/hop        FuzzParseDatagram    800000"
  "./relay/hop        FuzzReadPacketFrame  800000"
  "./relay/hop        FuzzReadFrame        800000"
  "./relay            FuzzLinkTable        50000"
  "./route            FuzzCandidates       40000"
  "./relay/admit      FuzzStream           250000"
  "./relay/admit      FuzzPackets          100000"
  "./relay/admit      FuzzTunSpec          10000"
  "./adminapi         FuzzHandler          90000"
  "./clusterset       FuzzDecode           60000"
  "./relay/tun        FuzzComplete         400000"
  "./relay/tun        FuzzClampMSS         400000"
  "./relay/tun        FuzzEchoRequest      400000"
  "./relay/tun        FuzzICMPErrorAbout   400000"
  "./relay/tun        FuzzRebuildVnetHdr   400000"
  "./relay/tun        FuzzHiddenICMP       150000"
  "./relay/tun        FuzzHeadersLen       100000"
  "./manifest         FuzzTunReaches       100000"
  "./relay/quic       FuzzChannelPacket    100000"
)
for t in "${targets[@]}"; do
  read -r pkg name n <<<"$t"
  echo "$go test $pkg -run '^\$' -fuzz '^$name\$' -fuzztime $((n * scale))x"
  "$go" test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$((n * scale))x"
done
