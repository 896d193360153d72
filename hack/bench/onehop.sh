# Sourced by the one-hop benches (cores.sh, profile-hop.sh): builds hoplink,
# gives a work directory that goes on exit with every process started by
# start, and writes relays hk (port 18401) and la (18402) into $work/m.yaml.
# The caller appends its Chains and Tunnels, then calls start_relays.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build
work=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# start NAME CMD...: CMD in the background, its log in $work/NAME.log, its pid in $last_pid.
start() { local name=$1; shift; (exec "$@") >"$work/$name.log" 2>&1 & last_pid=$!; pids+=("$last_pid"); }
cat >"$work/m.yaml" <<YAML
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: 18401}, endpoints: ["127.0.0.1:18401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: 18402}, endpoints: ["127.0.0.1:18402"]}
YAML
# start_relays ARGS...: certificates for both, then la (metrics on 18601) and
# hk (18602) with ARGS; their pids in $la and $hk.
start_relays() {
  bin/hoplink cert ca --certs "$work/certs" >/dev/null
  bin/hoplink cert issue --certs "$work/certs" hk la >/dev/null
  start la bin/hoplink relay -f "$work/m.yaml" --name la --certs "$work/certs" --metrics-addr 127.0.0.1:18601 "$@"; la=$last_pid
  start hk bin/hoplink relay -f "$work/m.yaml" --name hk --certs "$work/certs" --metrics-addr 127.0.0.1:18602 "$@"; hk=$last_pid
}
