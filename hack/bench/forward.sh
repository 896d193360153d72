#!/usr/bin/env bash
# Forwarding benchmark, all in one run on loopback so figures compare:
#   TCP throughput (iperf3): direct, haproxy, two haproxy processes in series
#     (what two user-space relays carry with no encryption at all), hoplink plain
#     forward (route [hk]), rathole (Noise), hoplink 1 hop (hk -> la) and 3 hops
#     (hk -> m1 -> m2 -> la); and bare quic-go's one stream between two
#     processes, the ceiling of a QUIC hop;
#   UDP at fixed offered rates (a sweep, to find where loss starts): direct vs 1 hop;
#   time to first byte of new connections, request/response latency with 300
#     clients, and relay RSS with 10,000 open flows (hack/bench/flowbench).
# Each relay is its own `hoplink relay` process, as on separate hosts.
# It writes its table into docs/benchmarks.md between the forward markers.
#
#   hack/bench/forward.sh                 # full run (~5 min)
#   DURATION=3 RR_SECONDS=5 FLOWS=1000 hack/bench/forward.sh   # quick look
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

DURATION=${DURATION:-10}     # seconds per iperf3 run
RR_SECONDS=${RR_SECONDS:-30} # seconds of the 300-client test
RR_CLIENTS=${RR_CLIENTS:-300}
UDP_RATES=${UDP_RATES:-200M 350M 500M 1G 1G/4M} # offered UDP rates; RATE/BUF: iperf3 -w BUF too (socket buffers)
FLOWS=${FLOWS:-10000}        # flows held open for the memory figure
TTFB_N=${TTFB_N:-1000}
OUT=${OUT:-docs/benchmarks.md}

log() { printf '\n== %s\n' "$*" >&2; }

# --- tools -------------------------------------------------------------------
missing=()
for p in iperf3 haproxy; do command -v "$p" >/dev/null || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
RATHOLE=$root/bin/rathole/bin/rathole
if [[ -z ${NO_RATHOLE:-} && ! -x $RATHOLE ]] && command -v cargo >/dev/null; then
  log "building rathole 0.5.0 from crates.io (once; cached in bin/rathole)"
  cargo install --quiet rathole --version 0.5.0 --root "$root/bin/rathole" || true
fi
make -s build
go build -o bin/flowbench ./hack/bench/flowbench
HOPLINK=${HOPLINK:-$root/bin/hoplink} # another build to compare: HOPLINK=/path/to/hoplink
FB=$root/bin/flowbench

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"
# start LOGNAME CMD...: run CMD in the background; its pid is in $last_pid.
# (exec ...) keeps $! the command's own pid: with an EXIT trap set, bash
# would otherwise fork an extra shell in between and cleanup would miss it.
start() { local name=$1; shift; (exec "$@") >"$work/$name.log" 2>&1 & last_pid=$!; pids+=("$last_pid"); }

# --- targets -----------------------------------------------------------------
IPERF=5201 ECHO=7000
start iperf3 iperf3 -s -p $IPERF
start echo $FB echo -addr 127.0.0.1:$ECHO
QECHO=7001
start quicecho $FB quicecho -addr 127.0.0.1:$QECHO

# --- hoplink: four relays, three chains ----------------------------------------
cat >"$work/bench.yaml" <<YAML
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: 17401}, endpoints: ["127.0.0.1:17401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m1}
spec: {listen: {address: 127.0.0.1, port: 17402}, endpoints: ["127.0.0.1:17402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m2}
spec: {listen: {address: 127.0.0.1, port: 17403}, endpoints: ["127.0.0.1:17403"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: 17404}, endpoints: ["127.0.0.1:17404"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: plain}
spec: {entry: hk, exit: hk, route: [hk]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: one}
spec: {entry: hk, exit: la, route: [hk, la], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: three}
spec: {entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: one-tls}
spec: {entry: hk, exit: la, route: [hk, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: three-tls}
spec: {entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: one-auto}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: three-auto}
spec: {entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la]}
YAML
tunnel() { # name chain protocol port target
  printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: %s, protocol: %s, listen: {address: 127.0.0.1, port: %s}, target: "%s"}\n' "$@" >>"$work/bench.yaml"
}
P_PLAIN=15300 P_ONE=15301 P_THREE=15303 E_ONE=15311 E_THREE=15313
P_ONE_TLS=15321 P_THREE_TLS=15323 E_ONE_TLS=15331 E_THREE_TLS=15333
P_ONE_AUTO=15341 P_THREE_AUTO=15343 E_ONE_AUTO=15351 E_THREE_AUTO=15353 P_HAPROXY=15500 E_HAPROXY=15510 P_HAPROXY2=15520 P_HAPROXY2_IN=15521 P_RATHOLE=15600 E_RATHOLE=15610
tunnel plain-iperf plain tcp $P_PLAIN 127.0.0.1:$IPERF
tunnel one-iperf one tcp $P_ONE 127.0.0.1:$IPERF
tunnel one-iperf-udp one udp $P_ONE 127.0.0.1:$IPERF
tunnel one-auto-iperf-udp one-auto udp $P_ONE_AUTO 127.0.0.1:$IPERF
tunnel three-iperf three tcp $P_THREE 127.0.0.1:$IPERF
tunnel one-echo one tcp $E_ONE 127.0.0.1:$ECHO
tunnel three-echo three tcp $E_THREE 127.0.0.1:$ECHO
tunnel one-tls-iperf one-tls tcp $P_ONE_TLS 127.0.0.1:$IPERF
tunnel three-tls-iperf three-tls tcp $P_THREE_TLS 127.0.0.1:$IPERF
tunnel one-tls-echo one-tls tcp $E_ONE_TLS 127.0.0.1:$ECHO
tunnel three-tls-echo three-tls tcp $E_THREE_TLS 127.0.0.1:$ECHO
tunnel one-auto-iperf one-auto tcp $P_ONE_AUTO 127.0.0.1:$IPERF
tunnel three-auto-iperf three-auto tcp $P_THREE_AUTO 127.0.0.1:$IPERF
tunnel one-auto-echo one-auto tcp $E_ONE_AUTO 127.0.0.1:$ECHO
tunnel three-auto-echo three-auto tcp $E_THREE_AUTO 127.0.0.1:$ECHO
$HOPLINK cert ca --certs "$work/certs" >/dev/null
$HOPLINK cert issue --certs "$work/certs" hk m1 m2 la >/dev/null
declare -A relay_pid
port=19464
for r in la m2 m1 hk; do
  # The memory row holds $FLOWS flows from one client host: above the
  # default share of one host (a sixteenth of a Tunnel's).
  start "relay-$r" $HOPLINK relay -f "$work/bench.yaml" --name $r --certs "$work/certs" --metrics-addr 127.0.0.1:$port --log-level warn \
    --max-flows-per-tunnel $((FLOWS + 1000)) --max-flows-per-source $((FLOWS + 1000))
  relay_pid[$r]=$last_pid
  port=$((port + 1))
done

# --- peers -------------------------------------------------------------------
cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 8000
defaults
  mode tcp
  timeout connect 5s
  timeout client 1m
  timeout server 1m
listen iperf
  bind 127.0.0.1:$P_HAPROXY
  server t 127.0.0.1:$IPERF
listen echo
  bind 127.0.0.1:$E_HAPROXY
  server t 127.0.0.1:$ECHO
listen pair-exit
  bind 127.0.0.1:$P_HAPROXY2_IN
  server t 127.0.0.1:$IPERF
CFG
start haproxy haproxy -f "$work/haproxy.cfg" -db
# A second process in front of the first: a 1-hop pair of relays that copy in
# user space and encrypt nothing, the most such a pair carries here.
cat >"$work/haproxy-entry.cfg" <<CFG
global
  maxconn 100
defaults
  mode tcp
  timeout connect 5s
  timeout client 1m
  timeout server 1m
listen pair-entry
  bind 127.0.0.1:$P_HAPROXY2
  server t 127.0.0.1:$P_HAPROXY2_IN
CFG
start haproxy-entry haproxy -f "$work/haproxy-entry.cfg" -db

have_rathole=0
if [[ -z ${NO_RATHOLE:-} && -x $RATHOLE ]]; then
  keys=$($RATHOLE --genkey)
  priv=$(echo "$keys" | sed -n '/Private Key/{n;p}')
  pub=$(echo "$keys" | sed -n '/Public Key/{n;p}')
  cat >"$work/rathole-server.toml" <<TOML
[server]
bind_addr = "127.0.0.1:2333"
[server.transport]
type = "noise"
[server.transport.noise]
local_private_key = "$priv"
[server.services.iperf]
token = "bench"
bind_addr = "127.0.0.1:$P_RATHOLE"
[server.services.echo]
token = "bench"
bind_addr = "127.0.0.1:$E_RATHOLE"
TOML
  cat >"$work/rathole-client.toml" <<TOML
[client]
remote_addr = "127.0.0.1:2333"
[client.transport]
type = "noise"
[client.transport.noise]
remote_public_key = "$pub"
[client.services.iperf]
token = "bench"
local_addr = "127.0.0.1:$IPERF"
[client.services.echo]
token = "bench"
local_addr = "127.0.0.1:$ECHO"
TOML
  RUST_LOG=error start rathole-server $RATHOLE --server "$work/rathole-server.toml"
  RUST_LOG=error start rathole-client $RATHOLE --client "$work/rathole-client.toml"
  have_rathole=1
fi

# --- wait until every path answers ---------------------------------------------
sleep 0.5
for p in "${pids[@]}"; do
  kill -0 "$p" 2>/dev/null || { echo "a benchmark process exited early (port in use?):" >&2; tail -n 3 "$work"/*.log >&2; exit 1; }
done
for p in $ECHO $E_ONE $E_THREE $E_ONE_TLS $E_THREE_TLS $E_ONE_AUTO $E_THREE_AUTO $E_HAPROXY $( ((have_rathole)) && echo $E_RATHOLE); do
  for i in $(seq 100); do
    if $FB ttfb -addr 127.0.0.1:$p -n 1 >/dev/null 2>&1; then break; fi
    [[ $i == 100 ]] && { echo "path on port $p never answered" >&2; cat "$work"/*.log >&2; exit 1; }
    sleep 0.2
  done
done

# --- measurements --------------------------------------------------------------
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
tcp_gbps() { # port -> "gbps retransmits"
  iperf3 -c 127.0.0.1 -p "$1" -t "$DURATION" -J | json "'%.2f %d' % (d['end']['sum_received']['bits_per_second']/1e9, d['end']['sum_sent'].get('retransmits', 0))"
}
udp_run() { # port rate[/buffer] -> "received_mbps loss_percent"
  local w=() out; [[ $2 == */* ]] && w=(-w "${2#*/}")
  # iperf3's server now and then refuses a test that follows another at once
  # (busy): try again.
  for _ in 1 2 3; do
    out=$(iperf3 -c 127.0.0.1 -p "$1" -u -b "${2%%/*}" -l 1200 "${w[@]}" -t "$DURATION" -J || true)
    grep -q '"sum_received"' <<<"$out" && break
    echo "iperf3 -u through $1: $(json "d.get('error', '?')" <<<"$out" 2>/dev/null); again" >&2; sleep 2
  done
  json "'%.0f %.2f' % (d['end']['sum_received']['bits_per_second']/1e6, 100*d['end']['sum_received']['lost_packets']/max(1,d['end']['sum_received']['packets']))" <<<"$out"
}
kv() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }

declare -A TCP UDP TTFB50 TTFB99 RR
log "TCP throughput, ${DURATION}s each"
for name in direct:$IPERF haproxy:$P_HAPROXY haproxy2:$P_HAPROXY2 plain:$P_PLAIN one:$P_ONE three:$P_THREE one_tls:$P_ONE_TLS three_tls:$P_THREE_TLS one_auto:$P_ONE_AUTO three_auto:$P_THREE_AUTO $( ((have_rathole)) && echo rathole:$P_RATHOLE); do
  TCP[${name%%:*}]=$(tcp_gbps "${name#*:}"); echo "${name%%:*}: ${TCP[${name%%:*}]}" >&2
done
# Bare quic-go, one stream between two processes and no relay around it: what
# a QUIC hop could carry here at most.
out=$($FB quicbulk -addr 127.0.0.1:$QECHO -duration "${DURATION}s"); echo "bare quic-go: $out" >&2
TCP[quicbulk]="$(echo "$out" | kv gbps) -"
log "UDP at $UDP_RATES offered, 1200-byte datagrams"
for rate in $UDP_RATES; do
  for name in direct:$IPERF one_auto:$P_ONE_AUTO one:$P_ONE; do
    UDP[${name%%:*}@$rate]=$(udp_run "${name#*:}" "$rate"); echo "${name%%:*} at $rate: ${UDP[${name%%:*}@$rate]}" >&2
  done
done
log "time to first byte, $TTFB_N new connections each"
for name in direct:$ECHO haproxy:$E_HAPROXY one:$E_ONE three:$E_THREE one_tls:$E_ONE_TLS three_tls:$E_THREE_TLS one_auto:$E_ONE_AUTO three_auto:$E_THREE_AUTO $( ((have_rathole)) && echo rathole:$E_RATHOLE); do
  out=$($FB ttfb -addr 127.0.0.1:${name#*:} -n "$TTFB_N"); echo "${name%%:*}: $out" >&2
  TTFB50[${name%%:*}]=$(echo "$out" | kv p50_us); TTFB99[${name%%:*}]=$(echo "$out" | kv p99_us)
done
# The floor of one hop: a small round trip of bare quic-go and of TCP
# between two processes, on connections already open.
out=$($FB quicrtt -addr 127.0.0.1:$QECHO -n "$TTFB_N"); echo "bare quic-go: $out" >&2
FLOOR_QUIC=$(echo "$out" | kv p50_us)
out=$($FB tcprtt -addr 127.0.0.1:$ECHO -n "$TTFB_N"); echo "bare TCP: $out" >&2
FLOOR_TCP=$(echo "$out" | kv p50_us)
log "$RR_CLIENTS request/response clients, ${RR_SECONDS}s each"
for name in direct:$ECHO one:$E_ONE three:$E_THREE one_tls:$E_ONE_TLS three_tls:$E_THREE_TLS one_auto:$E_ONE_AUTO three_auto:$E_THREE_AUTO; do
  RR[${name%%:*}]=$($FB rr -addr 127.0.0.1:${name#*:} -clients "$RR_CLIENTS" -duration "${RR_SECONDS}s"); echo "${name%%:*}: ${RR[${name%%:*}]}" >&2
done
log "relay memory with $FLOWS open flows (1 hop: hk -> la)"
HOLD=$($FB hold -addr 127.0.0.1:$E_ONE_AUTO -n "$FLOWS" -pids "${relay_pid[hk]},${relay_pid[la]}")
echo "$HOLD" >&2

# --- table -----------------------------------------------------------------------
ratio() { python3 -c "print('%.0f%%' % (100*$1/$2))"; }
gb() { echo "${TCP[$1]}" | cut -d' ' -f1; }
rt() { echo "${TCP[$1]}" | cut -d' ' -f2; }
rrf() { echo "${RR[$1]}" | kv "$2"; }
line() { # label key
  printf '| %s | %s | %s | %s |\n' "$1" "$(gb $2)" "$(ratio "$(gb $2)" "$(gb direct)")" "$(rt $2)"
}
hk_line=$(echo "$HOLD" | grep "pid=${relay_pid[hk]} ")
la_line=$(echo "$HOLD" | grep "pid=${relay_pid[la]} ")
{
  echo "<!-- forward:begin -->"
  echo "Measured $(date -u +%Y-%m-%d) on this machine ($(nproc) cores, loopback), hoplink $($HOPLINK version | cut -d' ' -f2-3 | tr -d '(,'), by"
  echo '`hack/bench/forward.sh`'" (DURATION=$DURATION, RR_SECONDS=$RR_SECONDS, FLOWS=$FLOWS). Every relay runs as its own process."
  echo
  echo "**TCP throughput** (iperf3, one stream, ${DURATION} s)"
  echo
  echo "| path | Gbit/s | of direct | retransmits |"
  echo "|---|---|---|---|"
  line "direct" direct
  line "haproxy (plain forward)" haproxy
  line "two haproxy processes in series (1 hop, no encryption)" haproxy2
  line "hoplink plain forward, route [hk] (splice)" plain
  ((have_rathole)) && line "rathole 0.5.0, Noise (encrypted, 1 hop)" rathole
  line "hoplink 1 hop, default (transport: auto)" one_auto
  line "hoplink 3 hops, default (transport: auto)" three_auto
  line "bare quic-go, one stream between two processes, no relay (the most a QUIC hop carries)" quicbulk
  line "hoplink 1 hop, QUIC + TLS 1.3 (transport: quic)" one
  line "hoplink 3 hops, QUIC + TLS 1.3 (transport: quic)" three
  line "hoplink 1 hop, TLS 1.3 over TCP (transport: tls)" one_tls
  line "hoplink 3 hops, TLS 1.3 over TCP (transport: tls)" three_tls
  echo
  echo "**UDP**, 1200-byte datagrams at fixed offered rates (iperf3 -u, ${DURATION} s each)"
  echo
  echo "The default transport's first session of the Tunnel (the first rate) rides QUIC until it passes"
  echo "16,000 datagrams a second; from then on the Tunnel is bulk and its sessions ride TLS."
  echo "With -w, iperf3's sockets (the target's among them) keep that buffer instead of the kernel's 208 KiB."
  echo
  echo "| offered | direct Mbit/s | direct loss | 1 hop, default (auto) Mbit/s | loss | points above direct | 1 hop, transport: quic Mbit/s | loss | points above direct |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for rate in $UDP_RATES; do
    set -- ${UDP[direct@$rate]} ${UDP[one_auto@$rate]} ${UDP[one@$rate]}
    label=$rate; [[ $rate == */* ]] && label="${rate%%/*}, iperf3 -w ${rate#*/}"
    printf '| %s | %s | %s%% | %s | %s%% | %s | %s | %s%% | %s |\n' "$label" "$1" "$2" "$3" "$4" "$(python3 -c "print('%.2f' % ($4-$2))")" \
      "$5" "$6" "$(python3 -c "print('%.2f' % ($6-$2))")"
  done
  echo
  echo "**Time to first byte** of a new connection ($TTFB_N connections one after another; connect, send 1 byte, receive its echo)"
  echo
  echo "| path | p50 µs | p99 µs | added p50 µs |"
  echo "|---|---|---|---|"
  for k in direct haproxy one_auto three_auto one three one_tls three_tls $( ((have_rathole)) && echo rathole); do
    printf '| %s | %s | %s | %s |\n' "$k" "${TTFB50[$k]}" "${TTFB99[$k]}" "$(python3 -c "print('%.0f' % (${TTFB50[$k]}-${TTFB50[direct]}))")"
  done
  echo
  echo "The floor of a hop, between two processes on connections already open (p50 µs): a new"
  echo "stream's 1-byte round trip on bare quic-go ${FLOOR_QUIC}, a 1-byte round trip on TCP ${FLOOR_TCP}."
  echo "Three QUIC hops and the client's extra TCP leg cannot add less than"
  echo "$(python3 -c "print('%.0f' % (3*$FLOOR_QUIC+$FLOOR_TCP))") µs to the first byte (3 x quic + tcp), before any relay work."
  echo
  echo "**Request/response**: $RR_CLIENTS clients, one connection each, 64-byte request and answer, 50 ms think time, ${RR_SECONDS} s"
  echo
  echo "| path | requests | avg µs | p50 µs | p95 µs | p99 µs |"
  echo "|---|---|---|---|---|---|"
  for k in direct one_auto three_auto one three one_tls three_tls; do
    printf '| %s | %s | %s | %s | %s | %s |\n' "$k" "$(rrf $k count)" "$(rrf $k avg_us)" "$(rrf $k p50_us)" "$(rrf $k p95_us)" "$(rrf $k p99_us)"
  done
  echo
  echo "**Relay memory** (RSS) with $FLOWS TCP flows open through hk -> la (transport: auto), each proven with one echo"
  echo
  echo "| relay | idle MiB | with flows MiB | KiB per flow |"
  echo "|---|---|---|---|"
  for l in "hk (entry)|$hk_line" "la (exit)|$la_line"; do
    v=${l#*|}
    printf '| %s | %.1f | %.1f | %s |\n' "${l%%|*}" "$(echo "$v" | kv rss_idle_kib | awk '{print $1/1024}')" "$(echo "$v" | kv rss_flows_kib | awk '{print $1/1024}')" "$(echo "$v" | kv per_flow_kib)"
  done
  echo "<!-- forward:end -->"
} >"$work/table.md"
cat "$work/table.md"

mkdir -p "$(dirname "$OUT")"
[[ -f $OUT ]] || printf '# Benchmarks\n\n## Forwarding\n\n<!-- forward:begin -->\n<!-- forward:end -->\n' >"$OUT"
python3 - "$OUT" "$work/table.md" <<'PY'
import re, sys
out, table = sys.argv[1], open(sys.argv[2]).read().strip()
doc = open(out).read()
doc = re.sub(r'<!-- forward:begin -->.*?<!-- forward:end -->', lambda m: table, doc, flags=re.S)
open(out, 'w').write(doc)
PY
log "wrote $OUT"
