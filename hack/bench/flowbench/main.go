// Command flowbench measures what iperf3 does not: time to first byte of
// new connections, request/response latency under many concurrent clients,
// relay memory with many open flows, and the round trip of bare quic-go and
// TCP between two processes (the floor of a hop) and bare quic-go's bulk
// throughput. hack/bench/forward.sh runs it
// against the direct path and each forwarder in one run; it prints
// key=value lines for the script to tabulate.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: flowbench echo|ttfb|rr|hold|quicecho|quicrtt|tcprtt|quicbulk [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:7000", "address to listen on (echo) or connect to")
	n := fs.Int("n", 1000, "connections (ttfb) or flows to hold (hold)")
	clients := fs.Int("clients", 300, "concurrent clients (rr)")
	duration := fs.Duration("duration", 30*time.Second, "how long to run (rr, quicbulk)")
	think := fs.Duration("think", 50*time.Millisecond, "pause between a client's requests (rr)")
	size := fs.Int("size", 64, "request and response size in bytes (rr)")
	pids := fs.String("pids", "", "comma-separated pids whose RSS to report (hold)")
	fs.Parse(os.Args[2:])
	raiseFileLimit()
	var err error
	switch os.Args[1] {
	case "echo":
		err = echo(*addr)
	case "ttfb":
		err = ttfb(*addr, *n)
	case "rr":
		err = rr(*addr, *clients, *duration, *think, *size)
	case "hold":
		err = hold(*addr, *n, *pids)
	case "quicecho":
		err = quicEcho(*addr)
	case "quicrtt":
		err = quicRTT(*addr, *n)
	case "tcprtt":
		err = tcpRTT(*addr, *n)
	case "quicbulk":
		err = quicBulk(*addr, *duration)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "flowbench:", err)
		os.Exit(1)
	}
}

func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// echo answers every byte it reads, on every connection, until killed.
func echo(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			// A plain copy: io.Copy(c, c) would splice through a pipe and
			// hold two more descriptors per connection, which caps the
			// flows a memory run can open under the descriptor limit.
			buf := make([]byte, 4096)
			io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf)
		}()
	}
}

// ttfb opens n connections one after another; each writes one byte and
// waits for the echo. The time from dial to that byte is what a client of a
// new connection waits before the first byte of an answer.
func ttfb(addr string, n int) error {
	lat := make([]time.Duration, 0, n)
	b := []byte{1}
	for range n {
		start := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("no first byte: %w", err)
		}
		lat = append(lat, time.Since(start))
		c.Close()
	}
	printStats("ttfb", lat, "")
	return nil
}

// rr runs clients that each keep one connection and send a request, wait
// for the full answer, pause, and repeat, as users of a chain do.
//
// Besides the whole round's figures it prints p99_settled_us, the p99 of
// the requests made once the round's first second is over: the clients
// arrive within one think time, and what their connections' setup costs
// the path shows in the other clients' requests of that second; and
// p99_late_us, of those made in the round's second half, and p99_each_s,
// the p99 of each second's requests in milliseconds: what a path does
// after the first seconds (a relay refilling its pools) shows there.
func rr(addr string, clients int, d, think time.Duration, size int) error {
	var mu sync.Mutex
	var all []time.Duration
	// seconds holds the requests by the second of the round they were
	// made in; the settled and late figures are taken from them.
	seconds := make([][]time.Duration, int(d/time.Second)+1)
	var failures int
	var wg sync.WaitGroup
	begin := time.Now()
	stop := begin.Add(d)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the clients' first requests over one think time.
			time.Sleep(think * time.Duration(i) / time.Duration(clients))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				mu.Lock()
				failures++
				mu.Unlock()
				return
			}
			defer c.Close()
			req, resp := make([]byte, size), make([]byte, size)
			var mine []time.Duration
			var at []int // the second of the round each of mine was made in
			// The first exchange carries the connection's setup through
			// the path (a TLS handshake between haproxy's pair, a pooled
			// connection or a stream between relays), which ttfb
			// measures: rr times requests on open connections.
			first := true
			for time.Now().Before(stop) {
				start := time.Now()
				c.SetDeadline(start.Add(10 * time.Second))
				if _, err := c.Write(req); err != nil {
					break
				}
				if _, err := io.ReadFull(c, resp); err != nil {
					break
				}
				if !first {
					l := time.Since(start)
					mine = append(mine, l)
					at = append(at, int(start.Sub(begin)/time.Second))
				}
				first = false
				time.Sleep(think)
			}
			mu.Lock()
			all = append(all, mine...)
			for j, l := range mine {
				if k := at[j]; k < len(seconds) {
					seconds[k] = append(seconds[k], l)
				}
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if failures > 0 {
		return fmt.Errorf("%d clients could not connect", failures)
	}
	var settled, late []time.Duration
	var each []string
	for k, sec := range seconds {
		if len(sec) == 0 {
			continue
		}
		slices.Sort(sec)
		each = append(each, fmt.Sprintf("%.1f", quantile(sec, .99)/1000))
		if k >= 1 {
			settled = append(settled, sec...)
		}
		if time.Duration(k)*time.Second >= d/2 {
			late = append(late, sec...)
		}
	}
	extra := ""
	for _, sub := range []struct {
		key string
		lat []time.Duration
	}{{"p99_settled_us", settled}, {"p99_late_us", late}} {
		if len(sub.lat) > 0 {
			slices.Sort(sub.lat)
			extra += fmt.Sprintf(" %s=%.1f", sub.key, quantile(sub.lat, .99))
		}
	}
	printStats("rr", all, extra+" p99_each_s="+strings.Join(each, ","))
	return nil
}

// hold opens n flows, proves each works end to end with one echo, keeps
// them all open, and reports the RSS of the given processes before and
// after, and per flow.
func hold(addr string, n int, pids string) error {
	var ps []int
	for _, p := range strings.Split(pids, ",") {
		if p == "" {
			continue
		}
		v, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("-pids: %w", err)
		}
		ps = append(ps, v)
	}
	before := make([]int, len(ps))
	for i, p := range ps {
		before[i] = rssKiB(p)
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	b := []byte{1}
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return fmt.Errorf("flow %d: %w", i, err)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("flow %d: %w", i, err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("flow %d: no echo: %w", i, err)
		}
	}
	time.Sleep(2 * time.Second) // let the relays settle (GC, pools)
	fmt.Printf("hold flows=%d\n", n)
	for i, p := range ps {
		after := rssKiB(p)
		fmt.Printf("hold pid=%d rss_idle_kib=%d rss_flows_kib=%d per_flow_kib=%.1f\n",
			p, before[i], after, float64(after-before[i])/float64(n))
	}
	return nil
}

func rssKiB(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			k, _ := strconv.Atoi(strings.Fields(v)[0])
			return k
		}
	}
	return -1
}

// printStats prints lat's figures, then extra.
func printStats(name string, lat []time.Duration, extra string) {
	if len(lat) == 0 {
		fmt.Printf("%s count=0\n", name)
		return
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	q := func(p float64) float64 { return quantile(lat, p) }
	fmt.Printf("%s count=%d avg_us=%.1f p50_us=%.1f p95_us=%.1f p99_us=%.1f max_us=%.1f",
		name, len(lat), us(sum/time.Duration(len(lat))), q(.50), q(.95), q(.99), us(lat[len(lat)-1]))
	fmt.Println(extra)
}

// quantile is the p-quantile of sorted, in microseconds.
func quantile(sorted []time.Duration, p float64) float64 {
	return us(sorted[min(len(sorted)-1, int(p*float64(len(sorted))))])
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
