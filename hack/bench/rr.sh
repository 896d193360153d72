#!/usr/bin/env bash
# Request/response through 1 hop (hk -> la), two builds side by side in one
# run: each build's relays run at once, and rounds alternate A B A B so both
# see the same machine load. It prints every round's figures and the medians.
#
#   OLD=/tmp/hoplink-old hack/bench/rr.sh          # old against this tree's build
#   ROUNDS=4 RR_SECONDS=15 RR_CLIENTS=300 CHAIN=one-auto hack/bench/rr.sh
#   PPROF=1 ...                                    # relays also serve /debug/pprof
# CHAIN: one-auto (default), one (quic), one-tls, three-auto, three, three-tls;
# CHAIN_OLD / CHAIN_NEW give each side its own (e.g. one build, two transports).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
RR_SECONDS=${RR_SECONDS:-15}
RR_CLIENTS=${RR_CLIENTS:-300}
ROUNDS=${ROUNDS:-4}
CHAIN=${CHAIN:-one-auto}
: "${OLD:?OLD=path to the build to compare}"
NEW=${NEW:-$root/bin/hoplink}
[[ -n ${NEW_BUILT:-} ]] || make -s build
go build -o bin/flowbench ./hack/bench/flowbench
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
start() { local name=$1; shift; (exec "$@") >"$work/$name.log" 2>&1 & last_pid=$!; pids+=("$last_pid"); }

ECHO=7100 IPERF=5301
start echo $FB echo -addr 127.0.0.1:$ECHO
# BULK_SECONDS: each round also runs one iperf3 stream through the same
# chain, to see that a change for small requests costs bulk nothing.
[[ -n ${BULK_SECONDS:-} ]] && start iperf3 iperf3 -s -p $IPERF
# setup BUILD TAG BASE: four relays and the tunnels of each chain shape,
# on ports from BASE; the Tunnel for CHAIN listens on BASE+100.
setup() {
  local bin=$1 tag=$2 base=$3 dir=$work/$2
  mkdir -p "$dir"
  local i=0
  for r in hk m1 m2 la; do
    i=$((i + 1))
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %s}, endpoints: ["127.0.0.1:%s"]}\n' $r $((base + i)) $((base + i)) >>"$dir/bench.yaml"
  done
  local spec chain=$4
  case $chain in
    one-auto) spec='{entry: hk, exit: la, route: [hk, la]}' ;;
    one) spec='{entry: hk, exit: la, route: [hk, la], transport: quic}' ;;
    one-tls) spec='{entry: hk, exit: la, route: [hk, la], transport: tls}' ;;
    three-auto) spec='{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la]}' ;;
    three) spec='{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: quic}' ;;
    three-tls) spec='{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: tls}' ;;
    *) echo "unknown CHAIN $chain" >&2; exit 2 ;;
  esac
  printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: %s\n---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: echo}\nspec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:%s"}\n' \
    "$spec" $((base + 100)) $ECHO >>"$dir/bench.yaml"
  printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: bulk}\nspec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:%s"}\n' \
    $((base + 101)) $IPERF >>"$dir/bench.yaml"
  $bin cert ca --certs "$dir/certs" >/dev/null
  $bin cert issue --certs "$dir/certs" hk m1 m2 la >/dev/null
  local port=$((base + 50)) relays=(hk la)
  [[ $chain == three* ]] && relays=(la m2 m1 hk)
  for r in "${relays[@]}"; do
    start "$tag-$r" $bin relay -f "$dir/bench.yaml" --name $r --certs "$dir/certs" --metrics-addr 127.0.0.1:$port --log-level warn ${PPROF:+--pprof}
    echo "$tag $r pid $last_pid metrics 127.0.0.1:$port" >&2
    relay_pids[$tag]+=" $last_pid"
    port=$((port + 1))
  done
}
declare -A relay_pids
# cpu_ticks TAG: user+system clock ticks the build's relays used so far.
cpu_ticks() { local t=0 p; for p in ${relay_pids[$1]}; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
udp_out() { awk '/^Udp:/{n++; if(n==2) print $5}' /proc/net/snmp; }
udp_drops() { awk '/^Udp:/{n++; if(n==2) print $6}' /proc/net/snmp; }
setup "$OLD" old 18000 "${CHAIN_OLD:-$CHAIN}"
setup "$NEW" new 18200 "${CHAIN_NEW:-$CHAIN}"
sleep 0.5
for port in $ECHO 18100 18300; do
  for i in $(seq 100); do
    $FB ttfb -addr 127.0.0.1:$port -n 1 >/dev/null 2>&1 && break
    [[ $i == 100 ]] && { echo "port $port never answered" >&2; tail -n 5 "$work"/*.log >&2; exit 1; }
    sleep 0.2
  done
done
kv() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
echo "chain ${CHAIN_OLD:-$CHAIN} / ${CHAIN_NEW:-$CHAIN}, $RR_CLIENTS clients, ${RR_SECONDS}s a round, $ROUNDS rounds each; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
declare -A res
tags="old new"
# DIRECT=1: each round also times the clients against the echo server with
# no relay, what this machine's load alone makes of a request.
[[ -n ${DIRECT:-} ]] && tags="direct old new"
for round in $(seq "$ROUNDS"); do
  for tag in $tags; do
    if [[ $tag == direct ]]; then
      out=$($FB rr -addr 127.0.0.1:$ECHO -clients "$RR_CLIENTS" -duration "${RR_SECONDS}s")
      echo "round $round direct: $out" >&2
      res[direct]+="$out"$'\n'
      continue
    fi
    port=18100; [[ $tag == new ]] && port=18300
    t0=$(cpu_ticks $tag) u0=$(udp_out) d0=$(udp_drops)
    out=$($FB rr -addr 127.0.0.1:$port -clients "$RR_CLIENTS" -duration "${RR_SECONDS}s")
    t1=$(cpu_ticks $tag) u1=$(udp_out) d1=$(udp_drops)
    # The relays' CPU time per request, in microseconds.
    out+=" relay_cpu_us=$(python3 -c "print('%.1f' % (($t1-$t0)/$(getconf CLK_TCK)*1e6/max(1,$(echo "$out" | kv count))))")"
    # UDP datagrams the host sent per request: the QUIC hop's packets,
    # both ways, ACKs included (anything else on the host adds to it).
    out+=" udp_per_req=$(python3 -c "print('%.2f' % (($u1-$u0)/max(1,$(echo "$out" | kv count))))")"
    # Datagrams the host dropped for a full receive buffer meanwhile.
    out+=" rcvbuf_drops=$((d1 - d0))"
    if [[ -n ${BULK_SECONDS:-} ]]; then
      out+=" bulk_gbps=$(iperf3 -c 127.0.0.1 -p $((port + 1)) -t "$BULK_SECONDS" -J | python3 -c "import json,sys; print('%.2f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9))")"
    fi
    echo "round $round $tag: $out" >&2
    res[$tag]+="$out"$'\n'
  done
done
for tag in $tags; do
  printf '%s median:' "$tag"
  for k in count p50_us p99_us avg_us relay_cpu_us udp_per_req rcvbuf_drops bulk_gbps; do
    v=$(echo -n "${res[$tag]}" | kv $k | sort -g | awk '{a[NR]=$1} END{if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
    [[ -n $v ]] && printf ' %s=%s' "$k" "$v"
  done
  echo
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
