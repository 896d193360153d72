#!/usr/bin/env bash
# A routed chain as wide as the CRD allows, in one `hoplink local` (issue
# 31): an entry, an exit and VIA via relays on loopback, every relay a
# possible next hop of every other, one sum chain with MAXHOPS, a TCP
# Tunnel. Runs it for DURATION with the rounds logged, samples its memory
# every second (killing it past MAXRSS_MB), then sends SIGTERM and times
# the exit (killing it 120 s later). Prints one line of figures.
#
#   hack/bench/widechain.sh                          # bin/hoplink, 32 via, maxHops 6, 90 s
#   BIN=/tmp/old/hoplink MAXHOPS=2 hack/bench/widechain.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-bin/hoplink}
VIA=${VIA:-32}
MAXHOPS=${MAXHOPS:-6}
DURATION=${DURATION:-90}
MAXRSS_MB=${MAXRSS_MB:-3000}
PORT=${PORT:-27400} # the relays take PORT.., the Tunnel PORT+80, its target PORT+81
LOG=${LOG:-}        # keep the process's log here

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
names=(entry exit)
for i in $(seq 0 $((VIA - 1))); do names+=("$(printf 'v%02d' "$i")"); done
{
  for i in "${!names[@]}"; do
    printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {port: %d}, endpoints: ["127.0.0.1:%d"]}\n' \
      "${names[$i]}" $((PORT + i)) $((PORT + i))
  done
  via=$(IFS=,; echo "${names[*]:2}")
  printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: wide}\nspec: {entry: entry, exit: exit, via: [%s], mode: sum, maxHops: %d}\n' "$via" "$MAXHOPS"
  printf -- '---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t}\nspec: {chain: wide, protocol: tcp, listen: {address: 127.0.0.1, port: %d}, target: "127.0.0.1:%d"}\n' \
    $((PORT + 80)) $((PORT + 81))
} >"$dir/wide.yaml"

python3 -m http.server $((PORT + 81)) --bind 127.0.0.1 >/dev/null 2>&1 &
target=$!
"$BIN" local -f "$dir/wide.yaml" --log-level debug >"$dir/log" 2>&1 &
pid=$!
maxrss=0 killed=""
for _ in $(seq 1 "$DURATION"); do
  sleep 1
  rss=$(awk '/VmRSS/{print int($2 / 1024)}' /proc/$pid/status 2>/dev/null || echo 0)
  ((rss > maxrss)) && maxrss=$rss
  if ((rss > MAXRSS_MB)); then killed="killed at ${rss} MB"; kill -9 $pid; break; fi
done
exit_s=""
if [ -z "$killed" ]; then
  t0=$(date +%s.%N)
  kill -TERM $pid
  for _ in $(seq 1 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then exit_s="still running 120 s after SIGTERM"; kill -9 $pid; else
    exit_s=$(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.1f s after SIGTERM'); fi
fi
wait $pid 2>/dev/null || true
kill $target 2>/dev/null || true
[ -z "$LOG" ] || cp "$dir/log" "$LOG"

# The rounds before SIGTERM ("shutting down"): how many, how many found
# every relay's table (this round's or, late, one of the last two
# intervals), how many found none but the entry's.
awk -v maxhops="$MAXHOPS" -v via="$VIA" -v rss="$maxrss" -v killed="$killed" -v ex="$exit_s" '
  /msg="shutting down"/ { stop = 1 }
  stop { next }
  /msg="route round"/ {
    n++
    u = 0
    if (match($0, /unmeasured="\[[^]]*\]"/)) { s = substr($0, RSTART + 12, RLENGTH - 14); u = split(s, a, " ") }
    if (u == 0) all++
    if (u >= via) none++
    if (match($0, /late="\[[^]]*\]"/)) late++
  }
  /msg="route changed"/ { changed++ }
  END {
    printf "via=%d maxHops=%d: max RSS %d MB%s; rounds %d, every relay measured in %d, no via relay in %d, late tables used in %d; route changes %d; %s\n",
      via, maxhops, rss, (killed != "" ? " (" killed ")" : ""), n, all, none, late, changed, (ex != "" ? ex : "no SIGTERM")
  }' "$dir/log"
