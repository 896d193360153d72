#!/usr/bin/env bash
# Where the two cores go: for each path, one iperf3 stream runs through it and
# this prints its throughput with the CPU (in cores) that iperf3's client and
# server and the entry and exit relays took (the kernel's work for a socket is
# mostly charged to the process in whose call it runs), and how much of the
# machine stayed idle. Relay cores per Gbit/s is the cost of a byte; a path
# with no idle left is CPU-bound here.
#   hack/bench/cores.sh               (about 2 minutes; prints a Markdown table)
source "$(dirname "$0")/onehop.sh"
chain() { printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: %s}\nspec: {entry: hk, exit: %s, route: %s%s}\n' "$@" >>"$work/m.yaml"; }
tunnel() { printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: %s, protocol: %s, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:18201"}\n' "$@" >>"$work/m.yaml"; }
chain plain hk "[hk]" ""
chain quic la "[hk, la]" ", transport: quic"
chain tls la "[hk, la]" ", transport: tls"
chain auto la "[hk, la]" ""
tunnel plain plain tcp 18500
tunnel quic quic tcp 18501
tunnel quic-udp quic udp 18501 # iperf3 -u keeps its control connection on TCP
tunnel tls tls tcp 18502
tunnel auto auto tcp 18503
tunnel auto-udp auto udp 18503 # udp.mode auto: bulk after its first session
start iperf3 iperf3 -s -p 18201; srv=$last_pid
start_relays --log-level warn
sleep 2

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime of a process
measure() { # label port [iperf3 args...]: 2 s of warm-up, then 6 s measured
  local label=$1 port=$2; shift 2
  iperf3 -c 127.0.0.1 -p "$port" -t 9 -J "$@" >"$work/out.json" &
  local cl=$!
  sleep 2
  local before="$(ticks $cl) $(ticks $srv) $(ticks $hk) $(ticks $la)" stat0 stat1 t0 t1
  stat0=$(head -1 /proc/stat); t0=$(date +%s.%N)
  sleep 6
  local after="$(ticks $cl) $(ticks $srv) $(ticks $hk) $(ticks $la)"
  stat1=$(head -1 /proc/stat); t1=$(date +%s.%N)
  wait "$cl"
  python3 - "$label" "$before" "$after" "$stat0" "$stat1" "$t0" "$t1" "$work/out.json" "$(nproc)" <<'PY'
import json, os, sys
label, before, after, s0, s1, t0, t1, out, ncpu = sys.argv[1:]
hz, dt = os.sysconf('SC_CLK_TCK'), float(t1) - float(t0)
proc = [(b - a) / hz / dt for a, b in zip(map(int, before.split()), map(int, after.split()))]
st = [b - a for a, b in zip(map(int, s0.split()[1:9]), map(int, s1.split()[1:9]))]
machine = lambda i: int(ncpu) * st[i] / sum(st)  # user nice system idle iowait irq softirq steal, in cores
end = json.load(open(out))['end']
r = end.get('sum_received') or end['sum']
mbps = r['bits_per_second'] / 1e6
loss = ' (%.0f%% lost)' % r['lost_percent'] if 'lost_percent' in r else ''
relays = proc[2] + proc[3]
per = '%.2f' % (relays / (mbps / 1000)) if relays > 0.05 else '-'
print('| %s | %.0f%s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |' % (
    label, mbps, loss, proc[0], proc[1], proc[2], proc[3], machine(3), per))
PY
}
echo "| path | Mbit/s | iperf3 client | iperf3 server | entry relay | exit relay | machine idle | relay cores per Gbit/s |"
echo "|---|---|---|---|---|---|---|---|"
measure "direct TCP" 18201
measure "plain forward, route [hk] (splice)" 18500
measure "1 hop, transport: tls" 18502
measure "1 hop, transport: quic" 18501
measure "direct UDP, 1 Gbit/s offered" 18201 -u -b 1G -l 1200
measure "1 hop UDP (QUIC), 1 Gbit/s offered" 18501 -u -b 1G -l 1200
iperf3 -c 127.0.0.1 -p 18503 -u -b 500M -l 1200 -t 1 >/dev/null # the Tunnel's first session: it turns bulk
measure "1 hop UDP (default: a bulk Tunnel's session over TLS), 1 Gbit/s offered" 18503 -u -b 1G -l 1200
