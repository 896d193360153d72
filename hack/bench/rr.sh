#!/usr/bin/env bash
# Request/response (hack/bench/flowbench rr) through hoplink relays beside
# the direct path and peers, all set up at once, rounds alternating over
# every path so each sees the same machine load. It prints every round's
# figures, the medians, and the latency each path adds over direct.
#
#   PEERS=1 DIRECT=1 CHAINS="one-auto three-auto" hack/bench/rr.sh
#                                                   # the issue-41 table
#   OLD=/tmp/hoplink-old hack/bench/rr.sh          # old build against this tree's
#   ROUNDS=4 RR_SECONDS=15 RR_CLIENTS=300 CHAINS=one-auto hack/bench/rr.sh
#   PPROF=1 ...                                    # relays also serve /debug/pprof
# p99_settled_us: the p99 of requests made after the round's first second,
# once the clients have arrived (their connections' setup shows in the first);
# p99_late_us: of those made in the round's second half; each round's line
# also has p99_each_s, the p99 of each second, in milliseconds.
#
# CHAINS: any of one-auto (default), one (quic), one-tls, three-auto, three,
# three-tls; every shape runs through one set of four relays per build.
# OLD: a second build, run with the same shapes (tags old:SHAPE).
# NEW_ENV, OLD_ENV: environment for that build's relays (GOMAXPROCS=1,
# GOGC=off, GODEBUG=...), NEW_ARGS, OLD_ARGS: flags (--flow-loops -1):
# OLD=bin/hoplink NEW_ARGS="--flow-loops -1" compares one build two ways.
# PEERS=1: haproxy as one plain TCP proxy (haproxy), and as two processes
# with mutual TLS between them (haproxy-tls: the shape of one hoplink hop).
# Each path's CPU per request is its processes' user+system time over the
# round divided by its requests (relays for hoplink, haproxy's processes for
# the peers; the clients and echo server are not counted anywhere); with
# perf installed, their system calls and context switches per request too.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
RR_SECONDS=${RR_SECONDS:-15}
RR_CLIENTS=${RR_CLIENTS:-300}
ROUNDS=${ROUNDS:-4}
CHAINS=${CHAINS:-${CHAIN:-one-auto}}
NEW=${NEW:-$root/bin/hoplink}
[[ -n ${NEW_BUILT:-} ]] || make -s build
go build -o bin/flowbench ./hack/bench/flowbench
FB=$root/bin/flowbench
if [[ -n ${PEERS:-} ]] && ! command -v haproxy >/dev/null; then
  echo "PEERS=1 needs haproxy (apt-get install haproxy)" >&2
  exit 1
fi
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
# path, to see that a change for small requests costs bulk nothing.
[[ -n ${BULK_SECONDS:-} ]] && start iperf3 iperf3 -s -p $IPERF

declare -A port_of pids_of metrics_of
# shape_spec SHAPE: the Chain spec of a chain shape.
shape_spec() {
  case $1 in
    one-auto) echo '{entry: hk, exit: la, route: [hk, la]}' ;;
    one) echo '{entry: hk, exit: la, route: [hk, la], transport: quic}' ;;
    one-tls) echo '{entry: hk, exit: la, route: [hk, la], transport: tls}' ;;
    three-auto) echo '{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la]}' ;;
    three) echo '{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: quic}' ;;
    three-tls) echo '{entry: hk, exit: la, via: [m1, m2], route: [hk, m1, m2, la], transport: tls}' ;;
    *) echo "unknown chain shape $1" >&2; return 2 ;;
  esac
}
# setup BUILD TAG BASE: four relays, and for the i-th shape of CHAINS a
# Chain and an echo Tunnel on BASE+100+2i (its bulk Tunnel on the next port).
setup() {
  local bin=$1 tag=$2 base=$3 dir=$work/$2 relay_env=$4 relay_args=$5
  mkdir -p "$dir"
  local i=0
  for r in hk m1 m2 la; do
    i=$((i + 1))
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %s}, endpoints: ["127.0.0.1:%s"]}\n' $r $((base + i)) $((base + i)) >>"$dir/bench.yaml"
  done
  i=0
  for shape in $CHAINS; do
    local p=$((base + 100 + 2 * i))
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c%s}\nspec: %s\n' $i "$(shape_spec "$shape")" >>"$dir/bench.yaml"
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: echo%s}\nspec: {chain: c%s, protocol: tcp, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:%s"}\n' $i $i $p $ECHO >>"$dir/bench.yaml"
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: bulk%s}\nspec: {chain: c%s, protocol: tcp, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:%s"}\n' $i $i $((p + 1)) $IPERF >>"$dir/bench.yaml"
    port_of[$tag:$shape]=$p
    i=$((i + 1))
  done
  $bin cert ca --certs "$dir/certs" >/dev/null
  $bin cert issue --certs "$dir/certs" hk m1 m2 la >/dev/null
  local port=$((base + 50)) all=""
  for r in la m2 m1 hk; do
    start "$tag-$r" env $relay_env $bin relay -f "$dir/bench.yaml" --name $r --certs "$dir/certs" --metrics-addr 127.0.0.1:$port --log-level warn ${PPROF:+--pprof} $relay_args
    echo "$tag $r pid $last_pid metrics 127.0.0.1:$port" >&2
    metrics_of[$tag]+=" $r=$port"
    all+=" $last_pid"
    port=$((port + 1))
  done
  for shape in $CHAINS; do pids_of[$tag:$shape]=$all; done
}
tags=""
[[ -n ${DIRECT:-} ]] && { tags+=" direct"; port_of[direct]=$ECHO; pids_of[direct]=""; }

# --- peers: haproxy, plain and as a TLS pair ------------------------------
if [[ -n ${PEERS:-} ]]; then
  H_PLAIN=18500 H_ENTRY=18502 H_EXIT=18504
  # The pair authenticates both ways, as relays do: ECDSA P-256 keys under
  # one CA, TLS 1.3.
  (
    cd "$work"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj /CN=bench-ca -days 2 -out ca.pem 2>/dev/null
    for n in entry exit; do
      openssl ecparam -name prime256v1 -genkey -noout -out $n.key 2>/dev/null
      openssl req -new -key $n.key -subj /CN=$n -out $n.csr 2>/dev/null
      openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out $n.crt 2>/dev/null
      cat $n.crt $n.key >$n.pem
    done
  )
  cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 8000${HAPROXY_THREADS:+
  nbthread $HAPROXY_THREADS}
  ssl-default-bind-options ssl-min-ver TLSv1.3
  ssl-default-server-options ssl-min-ver TLSv1.3
defaults
  mode tcp
  timeout connect 5s
  timeout client 1m
  timeout server 1m
listen plain
  bind 127.0.0.1:$H_PLAIN
  server t 127.0.0.1:$ECHO
listen plain-bulk
  bind 127.0.0.1:$((H_PLAIN + 1))
  server t 127.0.0.1:$IPERF
CFG
  # The entry and the exit of the pair are processes of their own, as two
  # relays are.
  cat >"$work/haproxy-exit.cfg" <<CFG
global
  maxconn 8000${HAPROXY_THREADS:+
  nbthread $HAPROXY_THREADS}
  ssl-default-bind-options ssl-min-ver TLSv1.3
defaults
  mode tcp
  timeout connect 5s
  timeout client 1m
  timeout server 1m
listen exit
  bind 127.0.0.1:$H_EXIT ssl crt $work/exit.pem ca-file $work/ca.pem verify required
  server t 127.0.0.1:$ECHO
listen exit-bulk
  bind 127.0.0.1:$((H_EXIT + 1)) ssl crt $work/exit.pem ca-file $work/ca.pem verify required
  server t 127.0.0.1:$IPERF
CFG
  cat >"$work/haproxy-entry.cfg" <<CFG
global
  maxconn 8000${HAPROXY_THREADS:+
  nbthread $HAPROXY_THREADS}
  ssl-default-server-options ssl-min-ver TLSv1.3
defaults
  mode tcp
  timeout connect 5s
  timeout client 1m
  timeout server 1m
listen entry
  bind 127.0.0.1:$H_ENTRY
  server t 127.0.0.1:$H_EXIT ssl crt $work/entry.pem ca-file $work/ca.pem verify required verifyhost exit
listen entry-bulk
  bind 127.0.0.1:$((H_ENTRY + 1))
  server t 127.0.0.1:$((H_EXIT + 1)) ssl crt $work/entry.pem ca-file $work/ca.pem verify required verifyhost exit
CFG
  start haproxy haproxy -f "$work/haproxy.cfg" -db
  port_of[haproxy]=$H_PLAIN pids_of[haproxy]=$last_pid
  start haproxy-exit haproxy -f "$work/haproxy-exit.cfg" -db
  p_exit=$last_pid
  start haproxy-entry haproxy -f "$work/haproxy-entry.cfg" -db
  port_of[haproxy-tls]=$H_ENTRY pids_of[haproxy-tls]="$last_pid $p_exit"
  tags+=" haproxy haproxy-tls"
fi

if [[ -n ${OLD:-} ]]; then
  setup "$OLD" old 18000 "${OLD_ENV:-}" "${OLD_ARGS:-}"
  for s in $CHAINS; do tags+=" old:$s"; done
fi
setup "$NEW" new 18200 "${NEW_ENV:-}" "${NEW_ARGS:-}"
for s in $CHAINS; do tags+=" new:$s"; done

# cpu_ticks TAG: user+system clock ticks the path's processes used so far.
cpu_ticks() { local t=0 p; for p in ${pids_of[$1]}; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
udp_out() { awk '/^Udp:/{n++; if(n==2) print $5}' /proc/net/snmp; }
udp_drops() { awk '/^Udp:/{n++; if(n==2) print $6}' /proc/net/snmp; }
sleep 0.5
for tag in $tags; do
  port=${port_of[$tag]}
  for i in $(seq 100); do
    $FB ttfb -addr 127.0.0.1:$port -n 1 >/dev/null 2>&1 && break
    [[ $i == 100 ]] && { echo "$tag (port $port) never answered" >&2; tail -n 5 "$work"/*.log >&2; exit 1; }
    sleep 0.2
  done
done
have_perf=""
perf stat -e raw_syscalls:sys_enter -x, -o /dev/null -- true 2>/dev/null && have_perf=1
kv() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
echo "paths:$tags; $RR_CLIENTS clients, ${RR_SECONDS}s a round, $ROUNDS rounds each; host tcp_congestion_control $(sysctl -n net.ipv4.tcp_congestion_control); load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
declare -A res
for round in $(seq "$ROUNDS"); do
  for tag in $tags; do
    port=${port_of[$tag]}
    perf_pid=""
    if [[ -n $have_perf && -n ${pids_of[$tag]} ]]; then
      # System calls and context switches of the path's processes, all
      # their threads, while the round runs: what a request costs in
      # kernel crossings and wake-ups, which the machine's load does not
      # change the way it changes latency.
      perf stat -e raw_syscalls:sys_enter,context-switches -x, -p "$(echo ${pids_of[$tag]} | tr ' ' ,)" -o "$work/perf.out" &
      perf_pid=$!
    fi
    t0=$(cpu_ticks $tag) u0=$(udp_out) d0=$(udp_drops)
    out=$($FB rr -addr 127.0.0.1:$port -clients "$RR_CLIENTS" -duration "${RR_SECONDS}s")
    t1=$(cpu_ticks $tag) u1=$(udp_out) d1=$(udp_drops)
    if [[ -n $perf_pid ]]; then
      kill -INT $perf_pid; wait $perf_pid || true
      n=$(echo "$out" | kv count)
      out+=" syscalls_per_req=$(awk -F, -v n="$n" '$3=="raw_syscalls:sys_enter"{printf "%.1f", $1/(n>0?n:1)}' "$work/perf.out")"
      out+=" switches_per_req=$(awk -F, -v n="$n" '$3=="context-switches"{printf "%.1f", $1/(n>0?n:1)}' "$work/perf.out")"
    fi
    if [[ $tag != direct ]]; then
      # The path's CPU time per request, in microseconds.
      out+=" cpu_us=$(python3 -c "print('%.1f' % (($t1-$t0)/$(getconf CLK_TCK)*1e6/max(1,$(echo "$out" | kv count))))")"
    fi
    if [[ $tag == *:* ]]; then
      # UDP datagrams the host sent per request: the QUIC hops' packets,
      # both ways, ACKs included (anything else on the host adds to it).
      out+=" udp_per_req=$(python3 -c "print('%.2f' % (($u1-$u0)/max(1,$(echo "$out" | kv count))))")"
      # Datagrams the host dropped for a full receive buffer meanwhile.
      out+=" rcvbuf_drops=$((d1 - d0))"
    fi
    if [[ -n ${BULK_SECONDS:-} ]]; then
      out+=" bulk_gbps=$(iperf3 -c 127.0.0.1 -p $([[ $tag == direct ]] && echo $IPERF || echo $((port + 1))) -t "$BULK_SECONDS" -J | python3 -c "import json,sys; print('%.2f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9))")"
    fi
    echo "round $round $tag: $out" >&2
    res[$tag]+="$out"$'\n'
  done
done
median() { sort -g | awk '{a[NR]=$1} END{if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
declare -A med
for tag in $tags; do
  printf '%s median:' "$tag"
  for k in count p50_us p99_us p99_settled_us p99_late_us avg_us cpu_us syscalls_per_req switches_per_req udp_per_req rcvbuf_drops bulk_gbps; do
    v=$(echo -n "${res[$tag]}" | kv $k | median)
    [[ -n $v ]] && printf ' %s=%s' "$k" "$v" && med[$tag:$k]=$v
  done
  echo
done
# Added latency: each round's figure minus the direct path's in the same
# round, then the median over rounds.
if [[ -n ${DIRECT:-} ]]; then
  for tag in $tags; do
    [[ $tag == direct ]] && continue
    printf '%s added over direct (median of rounds):' "$tag"
    for k in p50_us p99_us p99_settled_us p99_late_us; do
      v=$(paste <(echo -n "${res[$tag]}" | kv $k) <(echo -n "${res[direct]}" | kv $k) | awk '{print $1-$2}' | median)
      printf ' %s=%s' "$k" "$v"
    done
    echo
  done
fi
# What each relay chose for the flows it opened to the next (all shapes of
# a build, echo and bulk Tunnels together): transport, reason, count; and
# the handshakes it dialed.
for tag in "${!metrics_of[@]}"; do
  for rp in ${metrics_of[$tag]}; do
    curl -s "http://127.0.0.1:${rp#*=}/metrics" | awk -v t="$tag" -v r="${rp%%=*}" '
      /^hoplink_link_flows_total/ {
        match($0, /to="[^"]*"/); to=substr($0, RSTART+4, RLENGTH-5)
        match($0, /transport="[^"]*"/); tr=substr($0, RSTART+11, RLENGTH-12)
        match($0, /reason="[^"]*"/); re=substr($0, RSTART+8, RLENGTH-9)
        out=out sprintf(" %s->%s %s/%s=%d", r, to, tr, re, $NF)
      }
      /^hoplink_peer_handshakes_total.*direction="dial".*result="ok"/ { hs=$NF }
      END { if (out != "") print t " flows opened:" out; if (hs != "") print t " " r " TLS and QUIC handshakes dialed: " hs }' >&2
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
