// relayscale measures one relay with many Tunnels (issue 31): an entry
// relay and its exit in this process, a Chain between them and N TCP
// Tunnels entering at the first. It reports the time to parse the
// manifests and to start (every entry listening), memory, and the time of
// a reload that changes one Tunnel, both as SIGHUP does it (parse the files
// again, Update) and as a watch event does (manifests from objects,
// Update); how many entries each reload closed and opened (the right answer
// is one); and whether flows open across the reloads, on the changed
// Tunnel and others, all finish whole.
//
//	go run ./hack/bench/relayscale -tunnels 10000
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/local"
)

func main() {
	n := flag.Int("tunnels", 10000, "Tunnels entering at the relay")
	flows := flag.Int("flows", 50, "flows held open across the reloads")
	reloads := flag.Int("reloads", 5, "reloads of each kind (the median is reported)")
	out := flag.String("out", "docs/benchmarks.md", "file whose relay-scale section is replaced (empty: print only)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the reloads to this file")
	flag.Parse()
	raiseFileLimit()
	profile = *cpuProfile
	if err := run(*n, *flows, *reloads, *out); err != nil {
		log.Fatal(err)
	}
}

// profile is where the reloads' CPU profile goes (none if empty).
var profile string

func run(n, nFlows, reloads int, out string) error {
	target, err := echoServer()
	if err != nil {
		return err
	}
	ports, err := freePorts(n + 2)
	if err != nil {
		return err
	}
	doc := func(changedTarget string) []byte {
		var b strings.Builder
		for i, r := range []string{"r0", "r1"} {
			fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n", r, ports[i], ports[i])
		}
		b.WriteString("---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: r0, exit: r1, route: [r0, r1]}\n")
		for i := range n {
			t := target
			if i == 0 && changedTarget != "" {
				t = changedTarget
			}
			fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t%05d}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: %q}\n", i, ports[i+2], t)
		}
		return []byte(b.String())
	}
	yaml := doc("")
	var logs testutil.Buffer // the relays' log, to count the entries a reload touched
	cfg := relay.Config{Metrics: metrics.New(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(&logs, nil))}

	heap0 := heapInUse()
	done := measure()
	set, err := manifest.Parse("bench.yaml", yaml)
	if err != nil {
		return err
	}
	parse := done()
	done = measure()
	nw, err := local.Start(set, cfg)
	if err != nil {
		return err
	}
	defer nw.Close()
	start := done()
	entry := nw.Relays[0]
	if errs := entry.TunnelErrors(); len(errs) > 0 {
		return fmt.Errorf("%d entries did not open, e.g. %v", len(errs), first(errs))
	}
	heapStarted := heapInUse()
	rssStarted := rss()
	goroutines := runtime.NumGoroutine()

	// Flows held open, the first on the Tunnel that changes.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var flowErrs []error
	exchanges := 0
	for f := range nFlows {
		port := ports[2+f*(n/nFlows)]
		c, err := dialRetry(fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer c.Close()
			msg, buf := bytes.Repeat([]byte{byte(f)}, 256), make([]byte, 256)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				_, err := c.Write(msg)
				if err == nil {
					_, err = io.ReadFull(c, buf)
				}
				mu.Lock()
				if err != nil || !bytes.Equal(buf, msg) {
					flowErrs = append(flowErrs, fmt.Errorf("flow %d: %v", f, err))
					mu.Unlock()
					return
				}
				exchanges++
				mu.Unlock()
				// Slow enough that the flows' own work does not
				// crowd the reloads out of the CPU.
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	time.Sleep(500 * time.Millisecond)

	// Reloads, each changing Tunnel t00000's target (to another echo
	// server, then back), as SIGHUP does (files parsed again) and as a
	// watch event does (manifests from the cached objects).
	other, err := echoServer()
	if err != nil {
		return err
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	mark := len(logs.String())
	var hupParse, hupUpdate, evBuild, evUpdate []cost
	var touched []string
	update := func(s *manifest.Set) (cost, error) {
		done := measure()
		for _, r := range nw.Relays {
			if err := r.Update(s); err != nil {
				return cost{}, err
			}
		}
		d := done()
		all := logs.String()
		l := all[mark:]
		mark = len(all)
		touched = append(touched, fmt.Sprintf("%d/%d", strings.Count(l, `msg="tunnel closed"`), strings.Count(l, `msg="tunnel open"`)))
		return d, nil
	}
	for i := range reloads * 2 {
		changed := other
		if i%2 == 1 {
			changed = target
		}
		if i < reloads {
			files := doc(changed)
			done := measure()
			s, err := manifest.Parse("bench.yaml", files)
			if err != nil {
				return err
			}
			hupParse = append(hupParse, done())
			d, err := update(s)
			if err != nil {
				return err
			}
			hupUpdate = append(hupUpdate, d)
		} else {
			rl, cl, tl := set.Objects()
			tl[0].Spec.Target = changed
			done := measure()
			s, problems := manifest.FromObjects(rl, cl, tl)
			if len(problems) > 0 {
				return errors.Join(problems...)
			}
			evBuild = append(evBuild, done())
			d, err := update(s)
			if err != nil {
				return err
			}
			evUpdate = append(evUpdate, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	heapAfter, rssAfter := heapInUse(), rss()

	report := fmt.Sprintf(`<!-- relay-scale:begin -->
Measured %s on this machine (%d cores, shared) by `+"`go run ./hack/bench/relayscale -tunnels %d`"+`: an entry relay
and its exit in one process, %d TCP Tunnels entering at the entry; %d flows (one on the Tunnel that
changes) exchange 256 bytes every 100 ms across %d reloads. Times are wall clock, with the process's CPU
time meanwhile (the flows' and both relays' included): the wall time also holds waits for a core.

| what | figure |
|---|---|
| parse the manifests (%d objects) | %s |
| start both relays, every entry listening | %s |
| memory with every entry open: Go heap in use (process RSS) | %.0f MiB (%.0f MiB), %d goroutines |
| reload as SIGHUP does, one Tunnel changed: parse again + Update (median of %d) | %s + %s |
| reload as a watch event does: manifests from objects + Update (median of %d) | %s + %s |
| entries closed/opened by each reload (want 1/1) | %s |
| memory after the reloads: Go heap in use (process RSS) | %.0f MiB (%.0f MiB) |
| flows cut across the reloads | %d of %d (%d exchanges) |
<!-- relay-scale:end -->
`, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), n, n, nFlows, reloads*2,
		n+3, parse, start,
		float64(heapStarted-heap0)/(1<<20), rssStarted, goroutines,
		reloads, medianCost(hupParse), medianCost(hupUpdate),
		reloads, medianCost(evBuild), medianCost(evUpdate),
		strings.Join(touched, ", "),
		float64(heapAfter-heap0)/(1<<20), rssAfter,
		len(flowErrs), nFlows, exchanges)
	fmt.Print(report)
	for _, err := range flowErrs {
		fmt.Fprintln(os.Stderr, err)
	}
	if out != "" {
		return replaceSection(out, "relay-scale", report)
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// cost is an operation's wall time and the process's CPU time meanwhile:
// on a shared machine the wall time also holds the waits for a core.
type cost struct{ wall, cpu time.Duration }

func (c cost) String() string { return ms(c.wall) + " (CPU " + ms(c.cpu) + ")" }

// measure starts timing; the returned func ends it.
func measure() func() cost {
	t0, c0 := time.Now(), cpuTime()
	return func() cost { return cost{time.Since(t0), cpuTime() - c0} }
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func medianCost(cs []cost) cost {
	s := slices.Clone(cs)
	slices.SortFunc(s, func(a, b cost) int { return int(a.wall - b.wall) })
	return s[len(s)/2]
}

func first(m map[string]string) string {
	for k, v := range m {
		return k + ": " + v
	}
	return ""
}

// freePorts finds n loopback TCP ports below the ephemeral range (so that
// no outgoing connection takes one meanwhile) that nothing listens on.
func freePorts(n int) ([]int, error) {
	var out []int
	for p := 20000; p < 32768 && len(out) < n; p++ {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ln.Close()
		// QUIC listens on UDP at the relays' ports.
		if len(out) < 2 {
			u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				continue
			}
			u.Close()
		}
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("only %d free ports in 20000-32767, want %d", len(out), n)
	}
	return out, nil
}

func echoServer() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String(), nil
}

// dialRetry dials a Tunnel, again while the relays' link comes up.
func dialRetry(addr string) (net.Conn, error) {
	var err error
	for range 50 {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// rss is this process's resident memory in MiB.
func rss() float64 {
	data, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// raiseFileLimit lifts the descriptor limit to its hard maximum: every
// entry is a listening socket.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// replaceSection swaps the text between <!-- NAME:begin --> and <!-- NAME:end -->.
func replaceSection(file, name, section string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s := string(data)
	b, e := strings.Index(s, "<!-- "+name+":begin -->"), strings.Index(s, "<!-- "+name+":end -->")
	if b < 0 || e < 0 {
		return fmt.Errorf("%s has no %s markers", file, name)
	}
	e += len("<!-- " + name + ":end -->\n")
	return os.WriteFile(file, []byte(s[:b]+section+s[e:]), 0o644)
}
