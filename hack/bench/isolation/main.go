// Command isolation measures what one tenant's misbehaving clients cost
// another's. It runs two relays (hk -> la, each a `hoplink relay` process)
// carrying a victim Tunnel, whose bulk download and
// request/response client it times, next to other Tunnels that it abuses:
// N clients that stop reading a download (N = 4, 64, 1,000), 10,000 idle
// connections, and a UDP flood from 4,000 source ports. It prints the
// victim's throughput and p99 beside its baseline, measured in the same
// run, and whether each meets the target (90% of the throughput, at most
// twice the p99).
//
//	go run ./hack/bench/isolation -hoplink bin/hoplink
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

var repeat int

func main() {
	bin := flag.String("hoplink", "bin/hoplink", "the hoplink binary")
	only := flag.String("only", "", "run the scenarios whose name contains this")
	flag.IntVar(&repeat, "repeat", 3, "rounds of each scenario")
	duration := flag.Duration("duration", 5*time.Second, "how long each scenario measures the victim")
	settle := flag.Duration("settle", 2*time.Second, "how long the abuse runs before measuring")
	flag.Parse()
	if err := run(*bin, *only, *duration, *settle); err != nil {
		fmt.Fprintln(os.Stderr, "isolation:", err)
		os.Exit(1)
	}
}

// ports of the bench, on 127.0.0.1.
const (
	pHK, pLA                            = 17401, 17402
	pVictim, pStall, pIdle, pFlood      = 17410, 17411, 17412, 17413
	tVictim, tStall, tIdle, tFlood      = 17420, 17421, 17422, 17423
	bulkMode, echoMode             byte = 'b', 'e'
)

const manifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %[1]d}, endpoints: ["127.0.0.1:%[1]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[2]d}, endpoints: ["127.0.0.1:%[2]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: victim}
spec: {chain: c, listen: {address: 0.0.0.0, port: %[3]d}, target: "127.0.0.1:%[7]d"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: stalled}
spec: {chain: c, listen: {address: 0.0.0.0, port: %[4]d}, target: "127.0.0.1:%[8]d"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: idle}
spec: {chain: c, listen: {address: 0.0.0.0, port: %[5]d}, target: "127.0.0.1:%[9]d"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flood}
spec: {chain: c, protocol: udp, listen: {address: 0.0.0.0, port: %[6]d}, target: "127.0.0.1:%[10]d"}
`

func run(bin, only string, duration, settle time.Duration) error {
	raiseFileLimit()
	if os.Getenv("ISOLATION_TARGETS") != "" {
		return targets() // the child that serves the targets
	}
	dir, err := os.MkdirTemp("", "isolation")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	m := fmt.Sprintf(manifests, pHK, pLA, pVictim, pStall, pIdle, pFlood, tVictim, tStall, tIdle, tFlood)
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(m), 0o644); err != nil {
		return err
	}
	certs := filepath.Join(dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--certs", certs}, {"cert", "issue", "--certs", certs, "hk", "la"}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("hoplink %v: %v\n%s", args, err, out)
		}
	}
	// Each relay, and the targets, in a process of its own, as on
	// separate hosts: 10,000 flows need a descriptor each at every end,
	// and a process may have 20,000 here.
	start := func(name string, args ...string) (*exec.Cmd, error) {
		log, err := os.Create(filepath.Join(os.TempDir(), "isolation-"+name+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if name == "targets" {
			cmd.Env = append(os.Environ(), "ISOLATION_TARGETS=1")
		}
		return cmd, cmd.Start()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
		}
	}()
	var relays []*exec.Cmd
	hk := []string{"hk", bin, "relay", "-f", dir, "--name", "hk", "--certs", certs, "--log-level", "warn"}
	if addr := os.Getenv("ISOLATION_PPROF"); addr != "" {
		hk = append(hk, "--metrics-addr", addr, "--pprof") // to profile the entry
	}
	for _, c := range [][]string{
		{"targets", self},
		{"la", bin, "relay", "-f", dir, "--name", "la", "--certs", certs, "--log-level", "warn"},
		hk,
	} {
		p, err := start(c[0], c[1:]...)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		if c[0] != "targets" {
			relays = append(relays, p)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := roundTrips(200 * time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the victim Tunnel never answered (logs: %s/isolation-*.log)", os.TempDir())
		}
		time.Sleep(200 * time.Millisecond)
	}

	type scenario struct {
		name  string
		abuse func() (stop func(), err error)
		// busy: the abuse goes on while the victim is measured.
		busy bool
	}
	scenarios := []scenario{
		{"baseline", func() (func(), error) { return func() {}, nil }, false},
		{"4 stalled readers", stalled(4), false},
		{"64 stalled readers", stalled(64), false},
		{"1,000 stalled readers", stalled(1000), false},
		{"10,000 idle connections", idleConns(10000), false},
		{"UDP flood, 4,000 source ports, 20,000 packets/s", udpFlood(4000, 20000), true},
	}
	fmt.Printf("Measured %s on this machine, `go run ./hack/bench/isolation` (%v a measurement, abuse running %v before, medians of %d rounds).\n\n",
		time.Now().Format("2006-01-02"), duration, settle, repeat)
	fmt.Println("| abuse of other Tunnels | victim bulk alone / abused (Gbit/s) | of alone | victim request/response p99 alone / abused (µs) | of alone | target |")
	fmt.Println("|---|---|---|---|---|---|")
	pids := []int{relays[0].Process.Pid, relays[1].Process.Pid}
	for i, sc := range scenarios {
		if i == 0 || !strings.Contains(sc.name, only) {
			continue
		}
		// Each round measures the victim alone, then next to the abuse;
		// the figures are the medians of the rounds' ratios, since runs
		// on a shared 2-core machine vary more than the effect.
		var rounds []round
		for range repeat {
			time.Sleep(time.Second) // the last abuse's flows end
			waitQuiet(pids, 30*time.Second)
			base, err := measure(duration)
			if err != nil {
				return fmt.Errorf("%s: baseline: %w", sc.name, err)
			}
			stop, err := sc.abuse()
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			time.Sleep(settle)
			// Stalled readers stop once the kernel's buffers toward them
			// are full: until then they are downloads like any other,
			// sharing the relays' CPU. Measure once the relays are quiet.
			if !sc.busy {
				waitQuiet(pids, 90*time.Second)
			}
			r, err := measure(duration)
			stop()
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			rounds = append(rounds, round{base, r})
		}
		med := func(f func(round) float64) float64 {
			v := make([]float64, len(rounds))
			for k, r := range rounds {
				v[k] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		share := med(func(r round) float64 { return r.abused.gbps / r.base.gbps })
		p99x := med(func(r round) float64 { return float64(r.abused.p99) / float64(r.base.p99) })
		met := "met"
		if share < 0.9 || p99x > 2 {
			met = "missed"
		}
		fmt.Printf("| %s | %.2f / %.2f | %.0f%% | %d / %d | %.2fx | %s |\n", sc.name,
			med(func(r round) float64 { return r.base.gbps }), med(func(r round) float64 { return r.abused.gbps }), 100*share,
			int(med(func(r round) float64 { return float64(r.base.p99.Microseconds()) })),
			int(med(func(r round) float64 { return float64(r.abused.p99.Microseconds()) })), p99x, met)
	}
	return nil
}

type round struct{ base, abused result }

// waitQuiet waits until the processes use less than a fifth of a core over
// half a second, or max passed, and says how long that took.
func waitQuiet(pids []int, max time.Duration) time.Duration {
	ticks := func() int64 {
		var n int64
		for _, p := range pids {
			n += cpuTicks(p)
		}
		return n
	}
	start := time.Now()
	prev := ticks()
	for time.Since(start) < max {
		time.Sleep(500 * time.Millisecond)
		now := ticks()
		if now-prev < 10 { // ticks of 10 ms: 0.1 s of CPU in 0.5 s
			break
		}
		prev = now
	}
	return time.Since(start)
}

// cpuTicks is a process's user and system time, in clock ticks.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return ut + st
}

type result struct {
	gbps     float64
	p50, p99 time.Duration
}

// measure runs the victim's bulk download and its request/response client
// side by side.
func measure(d time.Duration) (result, error) {
	var r result
	var bulkErr, rrErr error
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.gbps, bulkErr = bulk(d)
	}()
	go func() {
		defer wg.Done()
		lat, rrErr = roundTrips(d)
	}()
	wg.Wait()
	if bulkErr != nil {
		return r, bulkErr
	}
	if rrErr != nil {
		return r, rrErr
	}
	slices.Sort(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	return r, nil
}

func dialVictim(mode byte) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", pVictim), 5*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{mode}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func bulk(d time.Duration) (float64, error) {
	c, err := dialVictim(bulkMode)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(d))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	if err != nil && !os.IsTimeout(err) {
		return 0, err
	}
	return float64(n) * 8 / time.Since(start).Seconds() / 1e9, nil
}

func roundTrips(d time.Duration) ([]time.Duration, error) {
	c, err := dialVictim(echoMode)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d + 10*time.Second))
	req, resp := make([]byte, 64), make([]byte, 64)
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		if _, err := c.Write(req); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(start))
	}
	if len(lat) == 0 {
		return nil, fmt.Errorf("no round trip")
	}
	return lat, nil
}

// stalled opens n downloads on the stalled Tunnel and never reads them,
// from several loopback hosts (one host's share of a Tunnel is bounded).
func stalled(n int) func() (func(), error) {
	return func() (func(), error) { return conns(n, pStall, true) }
}

func idleConns(n int) func() (func(), error) {
	return func() (func(), error) { return conns(n, pIdle, false) }
}

func conns(n, port int, download bool) (func(), error) {
	var cs []net.Conn
	stop := func() {
		for _, c := range cs {
			c.Close()
		}
	}
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 5, byte(1+i/500))}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			stop()
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(64 << 10) // a reader that stopped early
		}
		if download {
			c.Write([]byte("go"))
		}
		cs = append(cs, c)
	}
	return stop, nil
}

// udpFlood sends one-byte datagrams from n source ports, round robin, at
// rate packets a second, until stopped.
func udpFlood(n, rate int) func() (func(), error) {
	return func() (func(), error) {
		var cs []*net.UDPConn
		for range n {
			c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: pFlood})
			if err != nil {
				for _, c := range cs {
					c.Close()
				}
				return nil, err
			}
			cs = append(cs, c)
		}
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				for range rate / 100 {
					cs[i%len(cs)].Write([]byte{1})
					i++
				}
			}
		}()
		return func() {
			close(done)
			wg.Wait()
			for _, c := range cs {
				c.Close()
			}
		}, nil
	}
}

// targets serves the Tunnels' targets until killed.
func targets() error {
	for _, s := range []func() error{
		func() error { return serveTCP(tVictim, victimTarget) },
		func() error { return serveTCP(tStall, endless) },
		func() error { return serveTCP(tIdle, func(c net.Conn) { io.Copy(io.Discard, c) }) },
		func() error { return serveUDP(tFlood) },
	} {
		if err := s(); err != nil {
			return err
		}
	}
	select {}
}

func victimTarget(c net.Conn) {
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	if mode[0] == bulkMode {
		endless(c)
		return
	}
	io.Copy(c, c)
}

// endless sends until the connection fails, with the send buffer of a
// target on another host: on this one, every socket's buffers count
// against the same kernel TCP memory as the relays'.
func endless(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(64 << 10)
	}
	buf := make([]byte, 256<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

func serveTCP(port int, handle func(net.Conn)) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return nil
}

func serveUDP(port int) error {
	pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return nil
}

// raiseFileLimit allows the bench (and the relays it starts) a descriptor
// per connection of 10,000 idle flows at every end: as root, up to 2^20.
func raiseFileLimit() {
	want := syscall.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
		return
	}
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
