//go:build linux

// Command share measures how Tunnels share one link: two hosts (network
// namespaces) joined by an emulated link (-rate, -rtt, a buffer of one
// round trip at the rate), a `hoplink relay` on each, and three Tunnels
// over one Chain between them. In one run, on hosts whose TCP runs -cc:
//
//   - direct: 8 streams and 1 stream to the target at once, as the
//     Tunnels' clients would send without relays: the lone stream's
//     share is what per-connection fairness gives it;
//   - greedy and polite: Tunnel greedy with 8 streams beside Tunnel
//     polite with 1, per transport (-transports): polite's share of what
//     both carry, and both against the direct 9 streams' total;
//   - limited: Tunnel limited (spec.limits.rateMbps -limit) with 4
//     streams beside greedy's 8: its rate against the limit.
//
// With -udp, per transport too: Tunnel flood (UDP, 32 sessions of
// datagrams, -udp-offer Mbit/s in all) beside polite's 1 stream, and
// beside Tunnel lone (UDP, 1 session offering as much): polite's and
// lone's shares of what both deliver.
//
// With -baseline, each transport is measured with that binary too, in the
// same run, for a before and after on the same machine and load.
//
// Each figure is what the target received over -duration, after -warmup.
//
//	CGO_ENABLED=0 go build -o bin/hoplink ./cmd/hoplink
//	go run ./hack/bench/share -hoplink bin/hoplink     # as root; about 3 minutes
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
)

type options struct {
	hoplink          string
	baseline         string
	cc               string
	rate             int64 // Mbit/s
	rtt              time.Duration
	warmup, duration time.Duration
	limit            int
	transports       []string
	udp              bool
	udpOffer         int64 // Mbit/s, each UDP Tunnel
}

func main() {
	var o options
	var transports string
	flag.StringVar(&o.hoplink, "hoplink", "bin/hoplink", "the hoplink binary")
	flag.StringVar(&o.baseline, "baseline", "", "another hoplink binary to measure each transport with too (a build before a change)")
	flag.StringVar(&o.cc, "cc", "cubic", "the hosts' TCP congestion control")
	flag.Int64Var(&o.rate, "rate", 100, "the link's rate, Mbit/s each way")
	flag.DurationVar(&o.rtt, "rtt", 20*time.Millisecond, "the link's round trip")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "how long the streams run before the measurement")
	flag.DurationVar(&o.duration, "duration", 15*time.Second, "how long each measurement lasts")
	flag.IntVar(&o.limit, "limit", 20, "Tunnel limited's spec.limits.rateMbps")
	flag.StringVar(&transports, "transports", "auto,tls,quic", "the Chain's transports to measure, in turn")
	flag.BoolVar(&o.udp, "udp", false, "measure UDP Tunnels too: 32 sessions beside 1 TCP stream, and beside 1 UDP session")
	flag.Int64Var(&o.udpOffer, "udp-offer", 0, "what each UDP Tunnel offers, Mbit/s (0: twice -rate)")
	flag.Parse()
	if o.udpOffer == 0 {
		o.udpOffer = 2 * o.rate
	}
	o.transports = strings.Split(transports, ",")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "share:", err)
		os.Exit(1)
	}
}

// The target's ports, one per group of streams, and where the entry's
// Tunnels listen (the same ports on the client's host).
const (
	portGreedy, portPolite, portLimited = 7101, 7102, 7103
	portFlood, portLone                 = 7104, 7105 // UDP
	relayPort                           = 7401
)

func run(o options) error {
	restore, err := linkemu.AllowCongestionControl([]string{o.cc})
	if err != nil {
		return err
	}
	defer restore()
	fmt.Printf("Two hosts, one link: %d Mbit/s, %v round trip, a buffer of one round trip; TCP %s on both hosts; %v measured after %v of warm-up.\n\n",
		o.rate, o.rtt, o.cc, o.duration, o.warmup)
	fmt.Println("| path | greedy (8 streams), Mbit/s | polite (1 stream), Mbit/s | polite's share | both | limited (4 streams, limit) |")
	fmt.Println("|---|---|---|---|---|---|")
	direct := -1.0
	var udpRows []string
	type row struct{ transport, binary string }
	rows := []row{{"direct", ""}}
	for _, tr := range o.transports {
		if o.baseline != "" {
			rows = append(rows, row{tr, o.baseline})
		}
		rows = append(rows, row{tr, o.hoplink})
	}
	for _, rw := range rows {
		tr := rw.transport
		ob := o
		ob.hoplink = rw.binary
		r, err := measure(ob, tr)
		if err != nil {
			return fmt.Errorf("%s: %w", tr, err)
		}
		both := r.greedy + r.polite
		ratio := ""
		if direct < 0 {
			direct = both
		} else {
			ratio = fmt.Sprintf(" (%.2fx direct)", both/direct)
		}
		limited := "-"
		if tr != "direct" {
			limited = fmt.Sprintf("%.1f of %d (%+.1f%%), greedy beside it %.1f", r.limited, o.limit, 100*(r.limited/float64(o.limit)-1), r.greedyBeside)
		}
		name := "direct"
		if tr != "direct" {
			name = "1 hop, transport " + tr
		}
		if o.baseline != "" && tr != "direct" {
			name += ", " + filepath.Base(rw.binary)
		}
		fmt.Printf("| %s | %.1f | %.1f | %.1f%% | %.1f%s | %s |\n", name, r.greedy, r.polite, 100*r.polite/both, both, ratio, limited)
		if tr != "direct" && o.udp {
			udpRows = append(udpRows, fmt.Sprintf("| %s | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.1f%% |", name,
				r.floodTCP, r.politeUDP, 100*r.politeUDP/(r.floodTCP+r.politeUDP), r.floodUDP, r.lone, 100*r.lone/(r.floodUDP+r.lone)))
		}
	}
	if o.udp {
		fmt.Printf("\nUDP: each UDP Tunnel offers %d Mbit/s in 1000-byte datagrams (udp.mode datagram).\n\n", o.udpOffer)
		fmt.Println("| path | flood (32 sessions), Mbit/s | polite (1 TCP stream), Mbit/s | polite's share | flood (32 sessions), Mbit/s | lone (1 UDP session), Mbit/s | lone's share |")
		fmt.Println("|---|---|---|---|---|---|---|")
		for _, r := range udpRows {
			fmt.Println(r)
		}
	}
	return nil
}

type result struct {
	greedy, polite, limited, greedyBeside float64
	// With -udp: flood beside polite, and flood beside lone.
	floodTCP, politeUDP, floodUDP, lone float64
}

// measure builds the two hosts anew (a fresh link and fresh relays for
// each transport: nothing learnt carries over) and runs both scenarios.
func measure(o options, transport string) (result, error) {
	var r result
	n, err := linkemu.NewNet(fmt.Sprintf("shr%d", os.Getpid()%100000))
	if err != nil {
		return r, err
	}
	defer n.Close()
	a, err := n.AddNode("a")
	if err != nil {
		return r, err
	}
	b, err := n.AddNode("b")
	if err != nil {
		return r, err
	}
	// Allowed again for each pair of hosts: a benchmark running beside
	// this one may have put the host's list back since run allowed it.
	restore, err := linkemu.AllowCongestionControl([]string{o.cc})
	if err != nil {
		return r, err
	}
	for _, node := range []*linkemu.Node{a, b} {
		if err := node.SetCongestionControl(o.cc); err != nil {
			restore()
			return r, err
		}
	}
	restore()
	if _, err := n.Connect(a, b, linkemu.Params{Delay: o.rtt / 2, Rate: o.rate * 1e6, Queue: o.rtt}); err != nil {
		return r, err
	}
	sinks := map[int]*atomic.Int64{}
	for _, port := range []int{portGreedy, portPolite, portLimited} {
		var ln net.Listener
		if err := b.Do(func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return }); err != nil {
			return r, err
		}
		defer ln.Close()
		sinks[port] = new(atomic.Int64)
		go sink(ln, sinks[port])
	}
	if o.udp {
		for _, port := range []int{portFlood, portLone} {
			var pc net.PacketConn
			if err := b.Do(func() (err error) { pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port)); return }); err != nil {
				return r, err
			}
			defer pc.Close()
			sinks[port] = new(atomic.Int64)
			go sinkUDP(pc, sinks[port])
		}
	}
	addr := func(port int) string { return fmt.Sprintf("%s:%d", b.Addr, port) }
	if transport != "direct" {
		stop, err := relays(o, transport, a, b)
		if err != nil {
			return r, err
		}
		defer stop()
		addr = func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
		if err := waitTunnels(a, addr); err != nil {
			return r, err
		}
	}
	got, err := together(o, a, sinks, map[int]int{portGreedy: 8, portPolite: 1}, addr)
	if err != nil {
		return r, err
	}
	r.greedy, r.polite = got[portGreedy], got[portPolite]
	if transport == "direct" {
		return r, nil
	}
	got, err = together(o, a, sinks, map[int]int{portGreedy: 8, portLimited: 4}, addr)
	r.greedyBeside, r.limited = got[portGreedy], got[portLimited]
	if err != nil || !o.udp {
		return r, err
	}
	// UDP senders run beside together's streams; together measures their
	// targets too (0 streams of its own).
	stop, err := flood(o, a, map[int]int{portFlood: 32}, addr)
	if err != nil {
		return r, err
	}
	got, err = together(o, a, sinks, map[int]int{portFlood: 0, portPolite: 1}, addr)
	stop()
	r.floodTCP, r.politeUDP = got[portFlood], got[portPolite]
	if err != nil {
		return r, err
	}
	if stop, err = flood(o, a, map[int]int{portFlood: 32, portLone: 1}, addr); err != nil {
		return r, err
	}
	got, err = together(o, a, sinks, map[int]int{portFlood: 0, portLone: 0}, addr)
	stop()
	r.floodUDP, r.lone = got[portFlood], got[portLone]
	return r, err
}

// flood sends sessions[port] UDP sessions of 1000-byte datagrams to each
// port from a, o.udpOffer Mbit/s a port in all, until stop.
func flood(o options, a *linkemu.Node, sessions map[int]int, addr func(int) string) (stop func(), err error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	stop = func() {
		close(done)
		wg.Wait()
	}
	const size, tick = 1000, 5 * time.Millisecond
	perTick := int(float64(o.udpOffer) * 1e6 / 8 * tick.Seconds() / size)
	for port, n := range sessions {
		var conns []net.Conn
		for range n {
			var c net.Conn
			if err := a.Do(func() (err error) { c, err = net.Dial("udp", addr(port)); return }); err != nil {
				for _, c := range conns {
					c.Close()
				}
				stop()
				return nil, err
			}
			conns = append(conns, c)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, size)
			tk := time.NewTicker(tick)
			defer tk.Stop()
			next := 0
			for {
				select {
				case <-done:
					for _, c := range conns {
						c.Close()
					}
					return
				case <-tk.C:
				}
				for range perTick {
					conns[next].Write(p)
					next = (next + 1) % len(conns)
				}
			}
		}()
	}
	return stop, nil
}

// relays writes the manifests (one Chain a -> b over transport; Tunnels
// greedy, polite and limited to the target's ports) and starts a relay on
// each host; stop ends them.
func relays(o options, transport string, a, b *linkemu.Node) (stop func(), err error) {
	dir, err := os.MkdirTemp("", "sharebench")
	if err != nil {
		return nil, err
	}
	var m strings.Builder
	for _, node := range []*linkemu.Node{a, b} {
		fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {port: %d}, endpoints: [\"%s:%d\"]}\n---\n", node.Name, relayPort, node.Addr, relayPort)
	}
	fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: a, exit: b, route: [a, b], transport: %s}\n", transport)
	if o.udp {
		for name, port := range map[string]int{"flood": portFlood, "lone": portLone} {
			fmt.Fprintf(&m, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, protocol: udp, listen: {address: 127.0.0.1, port: %d}, target: \"%s:%d\", udp: {mode: datagram}}\n",
				name, port, b.Addr, port)
		}
	}
	for name, port := range map[string]int{"greedy": portGreedy, "polite": portPolite, "limited": portLimited} {
		limits := ""
		if name == "limited" {
			limits = fmt.Sprintf(", limits: {rateMbps: %d}", o.limit)
		}
		fmt.Fprintf(&m, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: \"%s:%d\"%s}\n",
			name, port, b.Addr, port, limits)
	}
	file := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(file, []byte(m.String()), 0o644); err != nil {
		return nil, err
	}
	certs := filepath.Join(dir, "certs")
	for _, args := range [][]string{{"cert", "ca", "--dir", certs}, {"cert", "issue", "--dir", certs, "a", "b"}} {
		if out, err := exec.Command(o.hoplink, args...).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("hoplink %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var procs []*exec.Cmd
	stop = func() {
		for _, p := range procs {
			p.Process.Kill()
			p.Wait()
		}
		os.RemoveAll(dir)
	}
	for _, node := range []*linkemu.Node{a, b} {
		logf, err := os.Create(filepath.Join(dir, node.Name+".log"))
		if err != nil {
			stop()
			return nil, err
		}
		cmd := node.Command(o.hoplink, "relay", "-f", file, "--name", node.Name, "--certs", certs, "--metrics-addr", "0", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			stop()
			return nil, err
		}
		procs = append(procs, cmd)
	}
	return stop, nil
}

// waitTunnels waits until each Tunnel carries a byte to its target.
func waitTunnels(a *linkemu.Node, addr func(int) string) error {
	deadline := time.Now().Add(60 * time.Second)
	for _, port := range []int{portGreedy, portPolite, portLimited} {
		for {
			var c net.Conn
			err := a.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr(port), 5*time.Second); return })
			if err == nil {
				_, err = c.Write([]byte("x"))
				c.Close()
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("Tunnel to port %d: %w", port, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	return nil
}

// together runs streams[port] senders to each port at once from a, and
// returns each port's goodput over o.duration after o.warmup, in Mbit/s.
func together(o options, a *linkemu.Node, sinks map[int]*atomic.Int64, streams map[int]int, addr func(int) string) (map[int]float64, error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for port, n := range streams {
		for range n {
			var c net.Conn
			if err := a.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr(port), 10*time.Second); return }); err != nil {
				close(done)
				wg.Wait()
				return nil, err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					select {
					case <-done:
						return
					default:
					}
					c.SetWriteDeadline(time.Now().Add(time.Second))
					if _, err := c.Write(buf); err != nil {
						var ne net.Error
						if !errors.As(err, &ne) || !ne.Timeout() {
							mu.Lock()
							errs = append(errs, fmt.Errorf("port %d: %w", port, err))
							mu.Unlock()
							return
						}
					}
				}
			}()
		}
	}
	time.Sleep(o.warmup)
	before := map[int]int64{}
	for port := range streams {
		before[port] = sinks[port].Load()
	}
	time.Sleep(o.duration)
	out := map[int]float64{}
	for port := range streams {
		out[port] = float64(sinks[port].Load()-before[port]) * 8 / o.duration.Seconds() / 1e6
	}
	close(done)
	wg.Wait()
	time.Sleep(time.Second) // the link drains before the next measurement
	return out, errors.Join(errs...)
}

// sink reads every connection of ln to its end, counting the bytes.
func sink(ln net.Listener, n *atomic.Int64) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				m, err := c.Read(buf)
				n.Add(int64(m))
				if err != nil {
					if err != io.EOF {
						c.(*net.TCPConn).SetLinger(0)
					}
					return
				}
			}
		}()
	}
}

// sinkUDP counts the bytes of every datagram pc receives.
func sinkUDP(pc net.PacketConn, n *atomic.Int64) {
	buf := make([]byte, 65535)
	for {
		m, _, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		n.Add(int64(m))
	}
}
