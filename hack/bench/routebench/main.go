//go:build linux

// Command routebench measures chains the way seed 004 did: 300 concurrent
// request/response clients in Hong Kong, for a fixed duration per path, to a
// target in US-East, directly, through a static chain (hk -> seattle -> la
// -> useast, the report's chain) and through sum and pipe chains, on the
// report's link latencies (internal/testing/seed004). It prints avg/p50/p95/p99 next to
// each path's theoretical latency, and with -out writes the table into a
// Markdown file between <!-- route:begin --> and <!-- route:end -->.
//
//	make build && go run ./hack/bench/routebench -hoplink bin/hoplink   # as root
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/seed004"
)

func main() {
	hoplink := flag.String("hoplink", "bin/hoplink", "the hoplink binary the relays run")
	clients := flag.Int("clients", 300, "concurrent clients")
	duration := flag.Duration("duration", 60*time.Second, "how long each path is measured")
	think := flag.Duration("think", 50*time.Millisecond, "pause between a client's requests")
	interval := flag.Duration("interval", 2*time.Second, "probe interval of the sum and pipe chains")
	out := flag.String("out", "", "Markdown file to write the table into (between the route markers)")
	flag.Parse()
	if err := run(*hoplink, *clients, *duration, *think, *interval, *out); err != nil {
		fmt.Fprintln(os.Stderr, "routebench:", err)
		os.Exit(1)
	}
}

type path struct {
	name, addr, chain, route string
	theory                   time.Duration
}

func run(hoplink string, clients int, duration, think, interval time.Duration, out string) error {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	dir, err := os.MkdirTemp("", "routebench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o := seed004.Options{Hoplink: hoplink, Dir: dir, Prefix: fmt.Sprintf("rb%d", os.Getpid()%100000), Interval: interval}
	n, err := seed004.Start(o)
	if err != nil {
		return err
	}
	defer n.Close()
	for _, c := range []string{seed004.Sum, seed004.Pipe} {
		if _, err := n.WaitRoute("hk", c, "hk,la,useast", time.Minute); err != nil {
			return err
		}
	}
	paths := []path{
		{"direct", n.TargetAddr(), "", "hk -> target over the 299 ms link", 299 * time.Millisecond},
		{"static chain", seed004.StaticAddr, seed004.Static, "hk,seattle,la,useast", 253 * time.Millisecond},
		{"sum", seed004.SumAddr, seed004.Sum, "", 221 * time.Millisecond},
		{"pipe", seed004.PipeAddr, seed004.Pipe, "", 221 * time.Millisecond},
	}
	var rows []string
	for _, p := range paths {
		fmt.Fprintf(os.Stderr, "== %s: %d clients for %v\n", p.name, clients, duration)
		rtts, failed := n.Run(p.addr, seed004.Load{Clients: clients, Duration: duration, Think: think})
		if p.chain != "" && p.route == "" {
			p.route = n.Route("hk", p.chain) // the route it kept to the end
		}
		q := func(x float64) time.Duration { return seed004.Quantile(rtts, x) }
		var sum time.Duration
		for _, d := range rtts {
			sum += d
		}
		avg := time.Duration(0)
		if len(rtts) > 0 {
			avg = sum / time.Duration(len(rtts))
		}
		over := func(d time.Duration) string { return fmt.Sprintf("%+.1f%%", 100*float64(d-p.theory)/float64(p.theory)) }
		row := fmt.Sprintf("| %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |",
			p.name, strings.ReplaceAll(p.route, ",", " → "), ms(p.theory), len(rtts), failed,
			ms(avg), ms(q(.5)), ms(q(.95)), ms(q(.99)), ms(q(1)), over(q(.5)), over(q(.99)))
		fmt.Fprintln(os.Stderr, row)
		rows = append(rows, row)
	}
	version, _ := exec.Command(hoplink, "version").Output()
	var b bytes.Buffer
	fmt.Fprintln(&b, "<!-- route:begin -->")
	fmt.Fprintf(&b, "Measured %s on this machine (%d cores), %s, by `hack/bench/route.sh` (clients=%d, duration=%v per path, think=%v, probe interval=%v).\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), strings.TrimSpace(string(version)), clients, duration, think, interval)
	fmt.Fprintln(&b, "| path | route | theoretical ms | requests | failed clients | avg ms | p50 ms | p95 ms | p99 ms | max ms | p50 vs theoretical | p99 vs theoretical |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintln(&b, r)
	}
	fmt.Fprintln(&b, "<!-- route:end -->")
	fmt.Print(b.String())
	if out == "" {
		return nil
	}
	doc, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?s)<!-- route:begin -->.*?<!-- route:end -->\n?`)
	if !re.Match(doc) {
		return fmt.Errorf("%s has no <!-- route:begin --> ... <!-- route:end --> markers", out)
	}
	return os.WriteFile(out, re.ReplaceAllLiteral(doc, b.Bytes()), 0o644)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
