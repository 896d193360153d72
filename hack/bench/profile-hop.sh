#!/usr/bin/env bash
# CPU-profiles the entry and exit relay of a one-hop chain while iperf3 pushes
# one TCP stream through it, and prints the top of each profile.
#   hack/bench/profile-hop.sh [SECONDS]     (profiles land in bin/profiles/)
secs=${1:-8}
source "$(dirname "$0")/onehop.sh"
out=bin/profiles; mkdir -p "$out"
cat >>"$work/m.yaml" <<YAML
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: one}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: iperf}
spec: {chain: one, listen: {address: 127.0.0.1, port: 18500}, target: "127.0.0.1:18201"}
YAML
start iperf3 iperf3 -s -p 18201
start_relays --pprof
sleep 1
iperf3 -c 127.0.0.1 -p 18500 -t $((secs + 2)) >"$work/client.log" &
client=$!
sleep 1
curl -s -o "$out/la.pprof" "http://127.0.0.1:18601/debug/pprof/profile?seconds=$secs" &
curl -s -o "$out/hk.pprof" "http://127.0.0.1:18602/debug/pprof/profile?seconds=$secs"
wait "$client" || true
grep -E "sender|receiver" "$work/client.log"
for r in hk la; do
  echo "== $r"; go tool pprof -top -nodecount=25 bin/hoplink "$out/$r.pprof" 2>/dev/null | sed -n '1,32p'
done
