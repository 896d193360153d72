#!/usr/bin/env bash
# TUN benchmark, in one run so figures compare: iperf3 (one TCP stream)
# between two network namespaces joined by a veth pair,
#   directly over the veth;
#   through wireguard-go (the Go module, configured with wg from Debian);
#   through hoplink tun Tunnels, entry relay in the client's namespace and
#     exit relay in the server's: flow mode and packet mode, over the TLS
#     transport, over QUIC and with the default (auto), with offload on and off.
# Each path is measured for each IP family of FAMILIES (default both): the
# stream's own family, inside the tunnel; the relays' link and wireguard's
# endpoints stay on IPv4, so that a path's two rows differ in that alone.
# Each figure is the median of REPEAT runs. Reported: Gbit/s, its share of
# wireguard-go's and (IPv6 rows) of IPv4's on the same path and mode,
# retransmits, CPU of the forwarders (the two relays, or the two
# wireguard-go processes) in cores, and the relays' peak RSS. It writes its
# table into docs/benchmarks.md between the tun markers. Needs root.
#
#   hack/bench/tun.sh                         # DURATION=10 REPEAT=3, about 16 minutes
#   DURATION=4 REPEAT=1 hack/bench/tun.sh     # a quick look
#   FAMILIES=6 hack/bench/tun.sh              # IPv6 alone
#   ONLY='^(direct|pkt-quic-true)' DURATION=2 REPEAT=1 hack/bench/tun.sh
#       # the paths whose names (see the log) match, both families; a run
#       # with ONLY prints its table and leaves docs/benchmarks.md alone
#   RELAY_ARGS='--metrics-addr 127.0.0.1:9101 --pprof' ONLY=... hack/bench/tun.sh
#       # more flags for both relays (each in its namespace): here, profiles
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

DURATION=${DURATION:-10}
REPEAT=${REPEAT:-3}
OUT=${OUT:-docs/benchmarks.md}
FAMILIES=${FAMILIES:-4 6}
ONLY=${ONLY:-}
WG_VERSION=${WG_VERSION:-v0.0.0-20260522210424-ecfc5a8d5446} # the wireguard-go hoplink builds with

log() { printf '\n== %s\n' "$*" >&2; }
# wanted NAME: whether ONLY lets the path NAME (without its family) run.
wanted() { [[ -z $ONLY || $1 =~ $ONLY ]]; }
# fam_name NAME F: the name of path NAME's family-F measure: a 6 at the end,
# or before an offload suffix (flow-tls6-true).
fam_name() {
  [[ $2 == 6 ]] || { echo "$1"; return; }
  case $1 in *-true | *-false) echo "${1%-*}6-${1##*-}" ;; *) echo "${1}6" ;; esac
}

# --- tools -------------------------------------------------------------------
missing=()
tools=(iperf3 ip python3)
if wanted wireguard; then tools+=(wg); fi
for p in "${tools[@]}"; do command -v "$p" >/dev/null || missing+=("$p"); done
if ((${#missing[@]})); then
  pkgs=()
  for p in "${missing[@]}"; do
    case $p in wg) pkgs+=(wireguard-tools) ;; ip) pkgs+=(iproute2) ;; *) pkgs+=("$p") ;; esac
  done
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi
WGGO=$root/bin/wireguard-go-$WG_VERSION
if wanted wireguard && [[ ! -x $WGGO ]]; then
  log "building wireguard-go $WG_VERSION (once; cached in bin/)"
  GOBIN=$root/bin/wg-tmp go install "golang.zx2c4.com/wireguard@$WG_VERSION"
  mv "$root/bin/wg-tmp/wireguard" "$WGGO" && rmdir "$root/bin/wg-tmp"
fi
make -s build
HOPLINK=${HOPLINK:-$root/bin/hoplink}

work=$(mktemp -d)
A=hlb-a$$ B=hlb-b$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
start() { local name=$1; shift; (exec "$@") >"$work/$name.log" 2>&1 & last_pid=$!; pids+=("$last_pid"); }
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }

# --- the two namespaces --------------------------------------------------------
ip netns add "$A"; ip netns add "$B"
ip -n "$A" link set lo up; ip -n "$B" link set lo up
ip link add veth-a netns "$A" type veth peer name veth-b netns "$B"
ip -n "$A" addr add 10.9.0.1/24 dev veth-a; ip -n "$B" addr add 10.9.0.2/24 dev veth-b
ip -n "$A" addr add fd09::1/64 dev veth-a nodad; ip -n "$B" addr add fd09::2/64 dev veth-b nodad
ip -n "$A" link set veth-a up; ip -n "$B" link set veth-b up
# CUBIC in both namespaces, as most hosts run, not this machine's BBR: the
# no-offload paths lose packets at full device queues, and how a stream
# answers loss is its congestion control's. The host must allow it first.
allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
grep -qw cubic "$allowed" || echo "$(cat "$allowed") cubic" >"$allowed"
for ns in "$A" "$B"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control=cubic; done
for i in 1 2 3 4 5 6; do
  ip -n "$B" addr add "10.77.$i.1/32" dev lo
  ip -n "$B" addr add "fd77:$i::1/128" dev lo nodad
done
start iperf3 ip netns exec "$B" iperf3 -s

cpu_ticks() { # summed utime and stime of pids, in clock ticks: "user system"
  local u=0 s=0 p
  for p in "$@"; do
    read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat")
    u=$((u + pu)) s=$((s + ps))
  done
  echo "$u $s"
}
peak_rss_mb() { # VmHWM of each pid, in MB: "a/b"
  local p out=()
  for p in "$@"; do out+=("$(awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$p/status")"); done
  (IFS=/; echo "${out[*]}")
}
reset_peaks() { local p; for p in "$@"; do echo 5 >"/proc/$p/clear_refs"; done; }
HZ=$(getconf CLK_TCK)

# sample NAME ADDR PIDS...: one iperf3 run; prints "gbps retransmits cores
# user-cores peak-RSS" (cores: the pids' CPU, user and system, over the
# run; user-cores: its user part alone), the peak RSS (MB, each pid's) taken over that run alone.
sample() {
  local name=$1 addr=$2; shift 2
  local t0 w0 t1 w1
  reset_peaks "$@"
  t0=$(cpu_ticks "$@"); w0=$(date +%s.%N)
  ip netns exec "$A" iperf3 -c "$addr" -t "$DURATION" -J >"$work/$name.json"
  t1=$(cpu_ticks "$@"); w1=$(date +%s.%N)
  python3 - "$work/$name.json" $t0 $t1 "$w0" "$w1" "$HZ" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["end"]["sum_sent"]
u0, s0, u1, s1, w0, w1, hz = map(float, sys.argv[2:])
wall = (w1 - w0) * hz
print("%.2f %d %.2f %.2f" % (j["end"]["sum_received"]["bits_per_second"] / 1e9, s.get("retransmits", 0), (u1 - u0 + s1 - s0) / wall, (u1 - u0) / wall), end=" ")
PY
  peak_rss_mb "$@"
  sleep 1
}

# measure NAME ADDR4 ADDR6 PIDS...: REPEAT runs of each family of FAMILIES,
# the families taking turns (4 6, then 6 4, ...) so that a change in the
# machine's load falls on both alike; sets RES[NAME] and RES[NAME6] (the 6
# before an offload suffix) to each family's median run.
measure() {
  local name=$1 addr4=$2 addr6=$3; shift 3
  local -A runs=()
  local r fam fams
  read -r -a fams <<<"$FAMILIES"
  for r in $(seq "$REPEAT"); do
    local order=("${fams[@]}")
    if ((r % 2 == 0)); then order=(); for ((i = ${#fams[@]} - 1; i >= 0; i--)); do order+=("${fams[i]}"); done; fi
    for fam in "${order[@]}"; do
      runs[$fam]+="$(sample "$(fam_name "$name" "$fam")" "$(family_addr "$fam" "$addr4" "$addr6")" "$@")"$'\n'
    done
  done
  for fam in "${fams[@]}"; do
    local key
    key=$(fam_name "$name" "$fam")
    RES[$key]=$(printf '%s' "${runs[$fam]}" | sort -n | sed -n "$(( (REPEAT + 1) / 2 ))p")
    echo "$key: ${RES[$key]}" >&2
  done
}

declare -A RES

# family_addr F V4 V6: the address of family F.
family_addr() { [[ $1 == 6 ]] && echo "$3" || echo "$2"; }

if wanted direct; then
  log "direct veth"
  measure direct 10.9.0.2 fd09::2
fi

if wanted wireguard; then
  log "wireguard-go"
  ip netns exec "$A" wg genkey >"$work/ka"; ip netns exec "$A" wg pubkey <"$work/ka" >"$work/pa"
  ip netns exec "$B" wg genkey >"$work/kb"; ip netns exec "$B" wg pubkey <"$work/kb" >"$work/pb"
  start wga ip netns exec "$A" env WG_PROCESS_FOREGROUND=1 "$WGGO" wga0; wga=$last_pid
  start wgb ip netns exec "$B" env WG_PROCESS_FOREGROUND=1 "$WGGO" wgb0; wgb=$last_pid
  for _ in $(seq 50); do ip -n "$A" link show wga0 >/dev/null 2>&1 && ip -n "$B" link show wgb0 >/dev/null 2>&1 && break; sleep 0.1; done
  ip netns exec "$A" wg set wga0 private-key "$work/ka" listen-port 51820 peer "$(cat "$work/pb")" endpoint 10.9.0.2:51820 allowed-ips 10.10.0.2/32,fd10::2/128
  ip netns exec "$B" wg set wgb0 private-key "$work/kb" listen-port 51820 peer "$(cat "$work/pa")" endpoint 10.9.0.1:51820 allowed-ips 10.10.0.1/32,fd10::1/128
  ip -n "$A" addr add 10.10.0.1/24 dev wga0; ip -n "$B" addr add 10.10.0.2/24 dev wgb0
  ip -n "$A" addr add fd10::1/64 dev wga0 nodad; ip -n "$B" addr add fd10::2/64 dev wgb0 nodad
  ip -n "$A" link set wga0 up; ip -n "$B" link set wgb0 up
  # wireguard-go runs as "wireguard-go" children of ip netns exec: find their pids.
  wgpids=$(pgrep -f "$WGGO wg[ab]0" | tr '\n' ' ')
  measure wireguard 10.10.0.2 fd10::2 $wgpids
  stop_all
  start iperf3 ip netns exec "$B" iperf3 -s
fi

# --- hoplink -------------------------------------------------------------------
cat >"$work/tun.yaml" <<YAML
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {endpoints: ["10.9.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {endpoints: ["10.9.0.2:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: tls}
spec: {entry: a, exit: b, route: [a, b], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: quic}
spec: {entry: a, exit: b, route: [a, b], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: auto}
spec: {entry: a, exit: b, route: [a, b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flow-tls}
spec: {chain: tls, protocol: tun, tun: {name: hl-ft, address: 10.201.0.1/24, routes: [10.77.1.0/24]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pkt-tls}
spec: {chain: tls, protocol: tun, tun: {name: hl-pt, address: 10.202.0.1/24, routes: [10.77.2.0/24], mode: packet}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flow-quic}
spec: {chain: quic, protocol: tun, tun: {name: hl-fq, address: 10.203.0.1/24, routes: [10.77.3.0/24]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pkt-quic}
spec: {chain: quic, protocol: tun, tun: {name: hl-pq, address: 10.204.0.1/24, routes: [10.77.4.0/24], mode: packet}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flow-auto}
spec: {chain: auto, protocol: tun, tun: {name: hl-fa, address: 10.205.0.1/24, routes: [10.77.5.0/24]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pkt-auto}
spec: {chain: auto, protocol: tun, tun: {name: hl-pa, address: 10.206.0.1/24, routes: [10.77.6.0/24], mode: packet}}
YAML
# The IPv6 twins: the same chains and modes, an IPv6 device and route.
for t in flow-tls:ft:tls:1 pkt-tls:pt:tls:2 flow-quic:fq:quic:3 pkt-quic:pq:quic:4 flow-auto:fa:auto:5 pkt-auto:pa:auto:6; do
  IFS=: read -r name dev chain i <<<"$t"
  mode=flow; [[ $name == pkt-* ]] && mode=packet
  cat >>"$work/tun.yaml" <<YAML
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: ${name}6}
spec: {chain: $chain, protocol: tun, tun: {name: hl-${dev}6, address: "fd20:$i::1/64", routes: ["fd77:$i::/64"], mode: $mode}}
YAML
done
$HOPLINK cert ca --certs "$work/certs" >/dev/null
$HOPLINK cert issue --certs "$work/certs" a b >/dev/null

for offload in true false; do
  any=
  for t in flow-tls pkt-tls flow-quic pkt-quic flow-auto pkt-auto; do if wanted "$t-$offload"; then any=1; fi; done
  [[ -n $any ]] || continue
  log "hoplink relays, --tun-offload=$offload"
  start "relay-b-$offload" ip netns exec "$B" "$HOPLINK" relay -f "$work/tun.yaml" --name b --certs "$work/certs" --tun-offload="$offload" ${RELAY_ARGS:-}
  rb=$last_pid
  start "relay-a-$offload" ip netns exec "$A" "$HOPLINK" relay -f "$work/tun.yaml" --name a --certs "$work/certs" --tun-offload="$offload" ${RELAY_ARGS:-}
  ra=$last_pid
  for _ in $(seq 100); do ip -n "$A" link show hl-pa6 >/dev/null 2>&1 && ip -n "$B" link show hl-pa6 >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 1
  for t in flow-tls:1 pkt-tls:2 flow-quic:3 pkt-quic:4 flow-auto:5 pkt-auto:6; do
    wanted "${t%%:*}-$offload" || continue
    i=${t#*:}
    measure "${t%%:*}-$offload" "10.77.$i.1" "fd77:$i::1" $ra $rb
  done
  stop_all
  start iperf3 ip netns exec "$B" iperf3 -s
done

# --- table ---------------------------------------------------------------------
f() { echo "${RES[$1]-}" | cut -d' ' -f"$2"; }
ratio() { # a b: a/b, or - when either is missing
  if [[ -z $1 || -z $2 ]]; then echo -; else python3 -c "print('%.2fx' % ($1/$2))"; fi
}
# row LABEL KEY: the path's row for each family measured. A key names the
# IPv4 measure; its IPv6 twin takes a 6 before the offload suffix.
row() {
  local fam key v4key=$2 wg
  for fam in $FAMILIES; do
    key=$(fam_name "$2" "$fam") wg=$(fam_name wireguard "$fam")
    [[ -n ${RES[$key]-} ]] || continue
    local of4=-
    [[ $fam == 6 ]] && of4=$(ratio "$(f "$key" 1)" "$(f "$v4key" 1)")
    local per=-
    [[ $(f "$key" 4) != 0.00 ]] && per=$(python3 -c "print('%.2f' % ($(f "$key" 4) / ($(f "$key" 1) / 8)))")
    printf '| %s | IPv%s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$fam" "$(f "$key" 1)" "$(ratio "$(f "$key" 1)" "$(f "$wg" 1)")" "$of4" "$(f "$key" 2)" "$(f "$key" 3)" "$(f "$key" 4)" "$per" "$(f "$key" 5 | sed "s/^$/-/")"
  done
}
{
  echo "<!-- tun:begin -->"
  echo "Measured $(date -u +%Y-%m-%d) on this machine ($(nproc) cores, kernel $(uname -r)), hoplink $($HOPLINK version | cut -d' ' -f2-3 | tr -d '(,'), by"
  echo '`hack/bench/tun.sh`'" (DURATION=$DURATION s, median of REPEAT=$REPEAT runs, the families taking turns). iperf3, one TCP stream (CUBIC: both namespaces' net.ipv4.tcp_congestion_control), client and entry in one namespace, server and exit in the other, one veth between. The family is the stream's, inside the tunnel; relays and wireguard-go link over IPv4 in both; of IPv4 is the IPv6 row's share of the IPv4 row above it. User CPU s per GB is the forwarders' CPU time outside the kernel for each gigabyte carried: the part a forwarder's own code spends, which the stream's family should not change."
  echo
  echo "| path | family | Gbit/s | of wireguard-go | of IPv4 | retransmits | forwarder CPU (cores) | of it, user | user CPU s per GB | peak RSS MB (entry/exit) |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  row "direct veth" direct
  row "wireguard-go $WG_VERSION" wireguard
  row "hoplink packet mode, default (auto), offload" pkt-auto-true
  row "hoplink flow mode, default (auto), offload" flow-auto-true
  row "hoplink packet mode, TLS, offload" pkt-tls-true
  row "hoplink flow mode, TLS, offload" flow-tls-true
  row "hoplink packet mode, QUIC, offload" pkt-quic-true
  row "hoplink flow mode, QUIC, offload" flow-quic-true
  row "hoplink packet mode, TLS, no offload" pkt-tls-false
  row "hoplink flow mode, TLS, no offload" flow-tls-false
  row "hoplink packet mode, QUIC, no offload" pkt-quic-false
  row "hoplink flow mode, QUIC, no offload" flow-quic-false
  row "hoplink packet mode, default (auto), no offload" pkt-auto-false
  row "hoplink flow mode, default (auto), no offload" flow-auto-false
  echo "<!-- tun:end -->"
} >"$work/table.md"
cat "$work/table.md"
if [[ -n $ONLY ]]; then
  log "ONLY is set: a partial table, not written to $OUT"
  exit 0
fi
python3 - "$OUT" "$work/table.md" <<'PY'
import re, sys
out, table = sys.argv[1], open(sys.argv[2]).read().strip()
doc = open(out).read()
if '<!-- tun:begin -->' not in doc:
    sys.exit(out + " has no <!-- tun:begin --> ... <!-- tun:end --> markers")
doc = re.sub(r'<!-- tun:begin -->.*?<!-- tun:end -->', lambda m: table, doc, flags=re.S)
open(out, 'w').write(doc)
PY
log "wrote $OUT"
