#!/usr/bin/env bash
# Shows the tun Tunnels of examples/tun at work, as root: two network
# namespaces joined by a veth (client side "cl", server side "sv"), relay a
# in cl and relay b in sv, then ping, HTTP and the relays' tun metrics
# through the flow-mode Tunnel (10.77.1.0/24) and the packet-mode one
# (10.77.2.0/24). Everything it made is removed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "tun-demo: run as root (it makes network namespaces and TUN devices)" >&2; exit 1; }
make -s build
bin=$PWD/bin/hoplink
work=$(mktemp -d)
CL=hl-demo-cl SV=hl-demo-sv
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$CL" 2>/dev/null || true
  ip netns del "$SV" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
show() { printf '\n$ %s\n' "$*"; "$@"; }
command -v curl >/dev/null || { echo "tun-demo: needs curl (apt-get install curl)" >&2; exit 1; }

ip netns add "$CL"; ip netns add "$SV"
ip -n "$CL" link set lo up; ip -n "$SV" link set lo up
ip link add veth-a netns "$CL" type veth peer name veth-b netns "$SV"
ip -n "$CL" addr add 10.9.0.1/24 dev veth-a; ip -n "$SV" addr add 10.9.0.2/24 dev veth-b
ip -n "$CL" link set veth-a up; ip -n "$SV" link set veth-b up
# The "remote networks": one address in each Tunnel's routes, behind b.
ip -n "$SV" addr add 10.77.1.1/32 dev lo; ip -n "$SV" addr add 10.77.2.1/32 dev lo
ip netns exec "$SV" python3 -m http.server --bind :: 8080 >/dev/null 2>&1 & pids+=($!)

"$bin" cert ca --certs "$work/certs" >/dev/null
"$bin" cert issue --certs "$work/certs" a b >/dev/null
ip netns exec "$SV" "$bin" relay -f examples/tun --name b --certs "$work/certs" >"$work/b.log" 2>&1 & pids+=($!)
ip netns exec "$CL" "$bin" relay -f examples/tun --name a --certs "$work/certs" --metrics-addr 127.0.0.1:9464 >"$work/a.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do
  ip -n "$CL" link show hl1 >/dev/null 2>&1 && ip -n "$SV" link show hl1 >/dev/null 2>&1 && break
  sleep 0.1
done
sleep 1

show ip -n "$CL" route
if command -v ping >/dev/null; then
  show ip netns exec "$CL" ping -c 2 -W 2 10.77.1.1
  show ip netns exec "$CL" ping -c 2 -W 2 10.77.2.1
  # Nothing has 10.77.1.9: its pings go unanswered, as they would anywhere.
  show ip netns exec "$CL" ping -c 2 -W 1 10.77.1.9 || true
else
  echo "(no ping here: apt-get install iputils-ping to see ICMP through both Tunnels)"
fi
show ip netns exec "$CL" curl -sS -o /dev/null -w '%{http_code} from %{remote_ip} in %{time_total}s\n' http://10.77.1.1:8080/
show ip netns exec "$CL" curl -sS -o /dev/null -w '%{http_code} from %{remote_ip} in %{time_total}s\n' http://10.77.2.1:8080/
printf '\n$ curl -s 127.0.0.1:9464/metrics | grep hoplink_tun_  # relay a\n'
ip netns exec "$CL" curl -s 127.0.0.1:9464/metrics | grep '^hoplink_tun_'
printf '\n--- relay a log\n'; cat "$work/a.log"
printf '\n--- relay b log\n'; cat "$work/b.log"
