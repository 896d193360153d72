//go:build linux

// Command wan measures relay chains across a long, lossy, rate-limited
// network, seed 004's by default: a client in Hong Kong and a target in
// US-East, joined directly by a link of 300 ms round trip, and by a chain of
// legs through Seattle and Los Angeles (152, 32 and 69 ms). Each host is a
// network namespace and each link a pair of TUN devices whose packets this
// process delays, drops and rate-limits (internal/linkemu); each host runs its
// own `hoplink relay`. The hosts' TCP congestion control is an input (-cc):
// CUBIC, as most hosts run, and BBR.
//
// For each congestion control and loss figure it builds the network anew
// and measures, from the client's host to the target's, the direct path,
// 1 hop (a relay on each of the two hosts, over the direct link) and the
// chain (a relay on every host), the relay paths over each transport:
//
//   - seed 002's request/response shape: one connection, -echoes sequential
//     1,000-byte echoes (100: 30 s on the direct path); the total, the p99
//     of the echoes' round trips and the first byte (the connect and the
//     first echo). Every path's at the same time, which takes as long as
//     the slowest path: one small message in flight per connection loads
//     nothing, and paths share links but no connection;
//   - bulk, one path after the other: one connection sending for -bulk,
//     then -streams connections at once for -bulk8; goodput is what the
//     target received within that time, the connects included.
//
// -paths tunchain and tun1hop measure the same relay paths entered by a
// flow-mode tun Tunnel instead of a TCP Tunnel's listener: the client
// dials the target's own address, which the entry's host routes into the
// Tunnel's device, and the entry's userspace stack (gvisor's netstack)
// ends the client's TCP on that host, so the long legs are the relays'.
//
// With -udp RATES (Mbit/s) it then measures UDP too, one path (tun ones
// left out) and rate at a time: a sender on the client's host paces
// -udp-size datagrams at the rate for -udp-time through a UDP Tunnel of
// the path's Chain (-udp-mode its spec.udp.mode; direct: straight to the
// target's host), each stamped with its sequence number and scheduled
// send time; a receiver on the target's host counts the unique ones and
// their lag behind schedule (sender and receiver share this process's
// clock). It reports the share delivered within the sending time and
// 2 s and the path's round trip after, p50 and p99 lag, copies, and the
// relays' hoplink_udp_dropped_packets_total by reason. -udp-only skips
// the echoes and bulk: a quick UDP look, under 2 minutes per loss at
// three rates on direct and chain:
//
//	go run ./hack/bench/wan -hoplink bin/hoplink -cc cubic -loss 1 -paths direct,chain -transports quic -udp 4,16,40 -udp-only
//
// Under transport auto it also reports which transport the relays took
// for each (hoplink_link_flows_total on each relay's metrics port).
//
// Loss falls on the long links: the direct one and the chain's longest leg
// carry the figure whole, the shorter legs -short-loss of it. Every link
// has the same rate limit and buffer (-rate, -queue). Other geographies
// run with -direct and -legs (say `-direct 200ms -legs 60ms,60ms,60ms,60ms`),
// and -jitter. Every measurement is bounded in time (-timeout for the
// echoes); an interrupted run removes its namespaces and puts back the
// host's list of allowed congestion controls, which it widens to let
// namespaces take CUBIC.
//
// The default run (CUBIC and BBR, loss 0, 0.1, 1 and 2%, all 7 paths)
// takes about 35 minutes on a 2-core machine, 4.5 per congestion control
// and loss; a quick look at one loss, under 3 minutes:
//
//	CGO_ENABLED=0 go build -o bin/hoplink ./cmd/hoplink
//	go run ./hack/bench/wan -hoplink bin/hoplink -out docs/benchmarks.md   # as root
//	go run ./hack/bench/wan -hoplink bin/hoplink -loss 1 -cc cubic -bulk 10s -bulk8 5s -echoes 30
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/relay/netstack"
)

// path is what a row measures: direct (hops 0), or a relay chain over a
// transport, entered by a TCP Tunnel's listener or, tun set, by a
// flow-mode tun Tunnel's device: the client dials the target's own
// address, which the entry host routes into the device, and the entry's
// userspace stack ends the client's TCP.
type path struct {
	hops      int
	transport string
	tun       bool
}

func (p path) String() string {
	via := p.transport
	if p.tun {
		via = "tun flow, " + p.transport
	}
	switch p.hops {
	case 0:
		return "direct"
	case 1:
		return "1 hop, " + via
	}
	return fmt.Sprintf("%d hops, %s", p.hops, via)
}

// parsePaths reads -paths and -transports: every relay path once per
// transport.
func parsePaths(paths, tps []string, legs int) ([]path, error) {
	var out []path
	for _, p := range paths {
		var hops int
		tun := strings.HasPrefix(p, "tun")
		switch p {
		case "direct":
			out = append(out, path{})
			continue
		case "1hop", "tun1hop":
			hops = 1
		case "chain", "tunchain":
			hops = legs
		default:
			return nil, fmt.Errorf("-paths %q: direct, 1hop, chain, tun1hop or tunchain", p)
		}
		for _, t := range tps {
			if t != "quic" && t != "tls" && t != "auto" {
				return nil, fmt.Errorf("-transports %q: quic, tls or auto", t)
			}
			out = append(out, path{hops, t, tun})
		}
	}
	return out, nil
}

type options struct {
	hoplink          string
	ccs              []string
	losses           []float64 // percent
	g                geography
	paths            []path
	bulk, bulk8      time.Duration
	streams          int
	echoes, size     int
	warm, timeout    time.Duration
	echoApart        bool
	udp              udpOptions
	out, commandLine string
}

var seedLegs = "152ms,32ms,69ms"

// sendMax, when set, is every namespace's most TCP send buffer
// (net.ipv4.tcp_wmem's third figure), in bytes.
var sendMax int

// keepLogs, when set, is where each network's relay logs are copied
// before it is removed.
var keepLogs string

func main() {
	var o options
	flag.StringVar(&o.hoplink, "hoplink", "bin/hoplink", "the hoplink binary the relays run")
	ccs := flag.String("cc", "cubic,bbr", "the hosts' TCP congestion controls, each a run of its own")
	losses := flag.String("loss", "0,0.1,1,2", "loss figures in percent, per direction of the long links")
	rate := flag.Float64("rate", 100, "rate limit of every link, Mbit/s each way (0: none)")
	queue := flag.Duration("queue", 100*time.Millisecond, "buffer of every link, in time at its rate; a packet that would wait longer is dropped")
	jitter := flag.Duration("jitter", 0, "jitter added to each packet's one-way delay on every link, uniform in [0, jitter); packets keep their order")
	direct := flag.Duration("direct", 300*time.Millisecond, "round trip of the direct link")
	legs := flag.String("legs", seedLegs, "round trips of the chain's legs, from the client's host on")
	short := flag.Float64("short-loss", 0.1, "share of the loss figure on legs shorter than the longest")
	paths := flag.String("paths", "direct,1hop,chain", "paths to measure: direct, 1hop, chain, and tun1hop, tunchain (the same entered by a flow-mode tun Tunnel)")
	tps := flag.String("transports", "quic,tls,auto", "transports of the relay paths")
	flag.StringVar(&keepLogs, "logs", "", "directory to keep the relays' logs in (warnings: why a flow failed)")
	flag.IntVar(&sendMax, "wmem", 0, "every host's most TCP send buffer in bytes (net.ipv4.tcp_wmem's third figure; 0: this machine's)")
	flag.DurationVar(&o.bulk, "bulk", 20*time.Second, "how long the one bulk stream sends")
	flag.DurationVar(&o.bulk8, "bulk8", 10*time.Second, "how long the -streams bulk streams send")
	flag.IntVar(&o.streams, "streams", 8, "bulk streams at once, for the second bulk figure")
	flag.IntVar(&o.echoes, "echoes", 100, "sequential echoes of the request/response shape")
	flag.IntVar(&o.size, "size", 1000, "bytes per echo")
	flag.DurationVar(&o.warm, "warm", 2*time.Second, "least time each relay path carries warm-up echoes before it is measured")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "most time the request/response shape may take")
	flag.BoolVar(&o.echoApart, "echo-apart", false, "measure the paths' request/response shapes one after another, not all at once")
	udpRates := flag.String("udp", "", "UDP rates in Mbit/s (such as 1,4,16,40,80): per path (not tun ones) and rate, a sender on the client's host paces datagrams through a UDP Tunnel (direct: straight) to a receiver on the target's host; empty: no UDP rows")
	flag.DurationVar(&o.udp.d, "udp-time", 10*time.Second, "how long each UDP sender sends")
	flag.IntVar(&o.udp.size, "udp-size", 1200, "bytes per UDP datagram (payload)")
	flag.StringVar(&o.udp.mode, "udp-mode", "", "the UDP Tunnels' spec.udp.mode: auto, datagram or stream (empty: the Tunnel's default)")
	flag.BoolVar(&o.udp.only, "udp-only", false, "measure the UDP rows only: no echoes, no bulk")
	flag.StringVar(&o.out, "out", "", "Markdown file to write the table into (between the wan markers)")
	cpuprofile := flag.String("cpuprofile", "", "write this process's CPU profile (the link emulator's) here")
	flag.Parse()
	o.commandLine = strings.Join(append([]string{"go run ./hack/bench/wan"}, os.Args[1:]...), " ")

	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "wan:", err)
		os.Exit(2)
	}
	o.ccs = split(*ccs)
	for _, s := range split(*losses) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v >= 100 {
			fail(fmt.Errorf("-loss %q: want percentages", s))
		}
		o.losses = append(o.losses, v)
	}
	o.g = geography{direct: *direct, rate: int64(*rate * 1e6), queue: *queue, jitter: *jitter, shortShare: *short}
	for _, s := range split(*legs) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			fail(fmt.Errorf("-legs %q: want round trips such as 152ms", s))
		}
		o.g.legs = append(o.g.legs, d)
	}
	if len(o.g.legs) < 2 {
		fail(errors.New("-legs: at least two legs (with one the chain would be the direct link)"))
	}
	o.g.names = []string{"hk", "seattle", "la", "useast"}
	if *legs != seedLegs {
		o.g.names = []string{"client"}
		for i := 1; i < len(o.g.legs); i++ {
			o.g.names = append(o.g.names, fmt.Sprintf("m%d", i))
		}
		o.g.names = append(o.g.names, "target")
	}
	var err error
	if o.paths, err = parsePaths(split(*paths), split(*tps), len(o.g.legs)); err != nil {
		fail(err)
	}
	if len(o.ccs) == 0 || len(o.losses) == 0 || len(o.paths) == 0 {
		fail(errors.New("nothing to measure"))
	}
	if o.udp.rates, err = parseRates(*udpRates); err != nil {
		fail(err)
	}
	if err := checkUDP(o.udp); err != nil {
		fail(err)
	}
	if len(o.udp.rates) > 0 && len(udpPaths(o.paths)) == 0 {
		fail(errors.New("-udp: no path to measure it on (tun paths carry no UDP rows)"))
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(o); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "wan:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// current is the network being measured, for the signal handler.
var current struct {
	sync.Mutex
	nw *network
}

func run(o options) error {
	restore, err := linkemu.AllowCongestionControl(o.ccs)
	if err != nil {
		return err
	}
	defer restore()
	// Interrupted, it still removes its namespaces and restores the host's
	// allowed list (the relays die with this process: Pdeathsig).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sig:
			current.Lock()
			if current.nw != nil {
				current.nw.close()
			}
			restore()
			os.Exit(130)
		case <-done:
		}
	}()

	start := time.Now()
	var rows []row
	var urows []udpRow
	for _, cc := range o.ccs {
		for _, loss := range o.losses {
			rs, us, err := runOne(o, cc, loss)
			rows = append(rows, rs...)
			urows = append(urows, us...)
			if err != nil {
				return fmt.Errorf("%s, %g%% loss: %w", cc, loss, err)
			}
		}
	}
	took := time.Since(start)
	table := render(o, rows, urows, took)
	fmt.Print(table)
	if o.out != "" {
		return writeBetween(o.out, o.marker(), table)
	}
	return nil
}

// row is one path's figures.
type row struct {
	cc    string
	loss  float64
	p     path
	echo  echoResult
	one   float64
	eight float64
	// oneErr and eightErr: the bulk runs' errors, if any.
	oneErr, eightErr error
	// tcpCC is the congestion control TCP ran with: the client's socket on
	// the direct path, the relays' busiest hop socket on relay paths.
	tcpCC string
	// Under auto: the flows each hop opened, and what the relays ended on.
	autoEcho, autoBulk []string
	hops               []hop
	info, goodput      string
}

func runOne(o options, cc string, loss float64) ([]row, []udpRow, error) {
	t0 := time.Now()
	fmt.Fprintf(os.Stderr, "== hosts' TCP %s, loss %g%%: building the network\n", cc, loss)
	nw, err := build(o.hoplink, o.g, cc, loss/100, o.paths, o.udp)
	if nw != nil {
		nw.tag = fmt.Sprintf("%s-%g", cc, loss)
	}
	current.Lock()
	current.nw = nw
	current.Unlock()
	defer func() {
		current.Lock()
		current.nw = nil
		current.Unlock()
		nw.close()
	}()
	if err != nil {
		return nil, nil, err
	}
	// Let what setting up sent leave the links.
	settle := max(time.Second, 2*o.g.direct)
	rows := make([]row, len(o.paths))
	addrs := make([][2]string, len(o.paths)) // echo, sink
	for i, p := range o.paths {
		rows[i] = row{cc: cc, loss: loss, p: p}
		addrs[i] = [2]string{nw.pathAddr(i, p, echoPort), nw.pathAddr(i, p, sinkPort)}
		if p.hops > 0 {
			rows[i].hops = pathHops(o.g.names, p.hops)
		}
	}
	var wg sync.WaitGroup
	for i, p := range o.paths {
		if p.hops > 0 {
			wg.Go(func() { warmUp(nw, addrs[i][0], o.size, o.warm) })
		}
	}
	wg.Wait()
	time.Sleep(settle)
	if !o.udp.only {
		if err := tcpRows(o, nw, rows, addrs, settle); err != nil {
			return rows, nil, err
		}
	} else {
		rows = nil
	}
	var urows []udpRow
	if len(o.udp.rates) > 0 {
		urows = udpRows(o, nw, cc, loss, settle)
	}
	time.Sleep(settle)
	fmt.Fprintf(os.Stderr, "   links:%s\n   (%v)\n", nw.linkStats(), time.Since(t0).Round(time.Second))
	return rows, urows, nil
}

// tcpRows measures the TCP shapes of rows (addrs: each path's echo and
// sink addresses): every path's echoes at once (unless -echo-apart), then
// each path's bulk in turn.
func tcpRows(o options, nw *network, rows []row, addrs [][2]string, settle time.Duration) error {
	var wg sync.WaitGroup
	// The request/response shape of every path at once, unless -echo-apart:
	// a connection with one small message in flight loads neither a link
	// nor a core, and paths share links but no connection (each Tunnel has
	// QUIC connections of its own); the phase then takes as long as the
	// slowest path instead of the sum of all.
	before := nw.snapshot()
	for i := range o.paths {
		measure := func() {
			rows[i].echo = echoShape(nw.dial, addrs[i][0], o.echoes, o.size, o.timeout)
		}
		if o.echoApart {
			measure()
		} else {
			wg.Go(measure)
		}
	}
	wg.Wait()
	afterEcho := nw.snapshot()
	for i, p := range o.paths {
		r := &rows[i]
		if p.hops == 0 {
			r.tcpCC = r.echo.cc
			if r.echo.cc != "" && r.echo.cc != r.cc {
				return fmt.Errorf("the client's socket runs %s, not the host's %s", r.echo.cc, r.cc)
			}
		}
		if p.transport == "auto" {
			r.autoEcho = flowsSince(before, afterEcho, r.hops)
		}
	}
	for i, p := range o.paths {
		r := &rows[i]
		time.Sleep(settle)
		beforeBulk := nw.snapshot()
		// Halfway through the one stream, which congestion control the
		// relays' TCP hops run.
		ccs := make(chan string, 1)
		go func() {
			time.Sleep(o.bulk / 2)
			var seen []string
			for _, h := range r.hops {
				if c := busiestCC(nw.node(h.from)); c != "" && !slices.Contains(seen, c) {
					seen = append(seen, c)
				}
			}
			ccs <- strings.Join(seen, "/")
		}()
		r.one, r.oneErr = bulk(nw.dial, addrs[i][1], 1, o.bulk, nw.sink)
		if c := <-ccs; p.hops > 0 {
			r.tcpCC = or(c, "–")
			if p.tun {
				// The client's TCP ends at the entry's netstack, on the
				// client's host: its leg runs the host's control one way
				// and the netstack's the other.
				r.tcpCC = fmt.Sprintf("client %s, netstack %s; hops %s", or(r.echo.cc, "?"), netstack.CongestionControl, r.tcpCC)
			}
		}
		time.Sleep(settle)
		r.eight, r.eightErr = bulk(nw.dial, addrs[i][1], o.streams, o.bulk8, nw.sink)
		if p.transport == "auto" {
			after := nw.snapshot()
			r.autoBulk = flowsSince(beforeBulk, after, r.hops)
			r.info, r.goodput = endState(after, r.hops)
		}
		fmt.Fprintf(os.Stderr, "%s | %g%% | %-13s | 1 stream %6.1f Mbit/s %v | %d streams %6.1f Mbit/s %v | echo total %v p99 %v first %v (%d done) %v | tcp %s\n",
			r.cc, r.loss, p, r.one, errOrEmpty(r.oneErr), o.streams, r.eight, errOrEmpty(r.eightErr),
			r.echo.total.Round(time.Millisecond), r.echo.p99.Round(time.Millisecond), r.echo.first.Round(time.Millisecond), r.echo.done, errOrEmpty(r.echo.err), r.tcpCC)
		if p.transport == "auto" {
			fmt.Fprintf(os.Stderr, "   auto: echo %s; bulk %s; end %s; %s\n", perHop(r.hops, r.autoEcho), perHop(r.hops, r.autoBulk), r.info, r.goodput)
		}
	}
	return nil
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}

// pathHops are the relay-to-relay hops of a path of hops hops.
func pathHops(names []string, hops int) []hop {
	if hops == 1 {
		return []hop{{names[0], names[len(names)-1]}}
	}
	var out []hop
	for i := 0; i+1 < len(names); i++ {
		out = append(out, hop{names[i], names[i+1]})
	}
	return out
}

// warmUp carries echoes over a relay path before it is measured, in
// rounds of 4 flows at once, until at least 4 flows and d have passed: a
// relay knows a Tunnel's shape from its first 4 flows, and a link's loss
// from the losses it sees.
func warmUp(nw *network, addr string, size int, d time.Duration) {
	start := time.Now()
	for n := 0; n < 4 || time.Since(start) < d; n += 4 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { echoShape(nw.dial, addr, 4, size, time.Minute) })
		}
		wg.Wait()
	}
}

// endState is, under auto, each hop's bulk transport and the goodput its
// relay saw per transport.
func endState(s snapshot, hops []hop) (info, goodput string) {
	var is, gs []string
	for _, h := range hops {
		is = append(is, or(s.info[h], "none"))
		var g []string
		for _, t := range []string{"tls", "quic"} {
			if v, ok := s.goodput[sample{h, t, ""}]; ok {
				g = append(g, fmt.Sprintf("%s %.1f", t, v/1e6))
			}
		}
		gs = append(gs, or(strings.Join(g, ", "), "none"))
	}
	return perHop(hops, is), perHop(hops, gs)
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func render(o options, rows []row, urows []udpRow, took time.Duration) string {
	var b strings.Builder
	version, _ := exec.Command(o.hoplink, "version").Output()
	rev, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
	g := o.g
	names := g.names
	chain := strings.Join(names, " → ")
	var legs []string
	for i, l := range g.legs {
		legs = append(legs, fmt.Sprintf("%s-%s %v", names[i], names[i+1], l))
	}
	rate := "no rate limit"
	if g.rate > 0 {
		rate = fmt.Sprintf("%g Mbit/s each way, a buffer of %v at that rate", float64(g.rate)/1e6, g.queue)
	}
	jitter := ""
	if g.jitter > 0 {
		jitter = fmt.Sprintf(", jitter up to %v on each link's one-way delay", g.jitter)
	}
	together := ", every path's at the same time (bulk runs one path at a time)"
	if o.echoApart {
		together = ", one path at a time"
	}
	fmt.Fprintf(&b, "<!-- %s:begin -->\n", o.marker())
	fmt.Fprintf(&b, "Measured %s on this machine (%d cores), %s (tree %s), by `%s` (as root), in %v.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), strings.TrimSpace(string(version)), strings.TrimSpace(string(rev)), o.commandLine, took.Round(time.Minute))
	fmt.Fprintf(&b, "Hosts %s, one network namespace each, with its own `hoplink relay`. Links (round trips): direct %s-%s %v; chain %s. Every link: %s%s. "+
		"**Loss** is per direction, on the direct link and the chain's longest leg; the shorter legs lose %g of it. "+
		"**Hosts' CC** is every host's TCP congestion control (the namespace's default: clients, targets and relays' TCP hops alike); ",
		chain, names[0], names[len(names)-1], g.direct, strings.Join(legs, ", "), rate, jitter, g.shortShare)
	if o.udp.only {
		fmt.Fprintf(&b, "relay paths first carry TCP warm-up echoes (rounds of 4 flows, at least %v). 1 hop: relays on the two end hosts, over the direct link; %d hops: a relay on every host.\n\n",
			o.warm, len(g.legs))
		udpTable(&b, o, urows)
		fmt.Fprintf(&b, "<!-- %s:end -->\n", o.marker())
		return b.String()
	}
	fmt.Fprintf(&b, "**TCP CC seen** is what ran: the client's socket on the direct path, the relays' busiest hop socket halfway through the one stream on relay paths (– where none carried 64 KiB: QUIC); "+
		"on tun flow paths also the client's socket and the entry's userspace stack (gvisor netstack) that ends it on the client's host. "+
		"Bulk: goodput the target received while the sender sent, connects included, one stream for %v, then %d at once for %v. "+
		"Echo: seed 002's shape, one connection and %d sequential %d-byte echoes%s; p99 of their round trips by nearest rank; first byte is the connect and the first echo. "+
		"Relay paths first carry warm-up echoes (rounds of 4 flows, at least %v). 1 hop: relays on the two end hosts, over the direct link; %d hops: a relay on every host. "+
		"**tun flow**: the entry is a flow-mode tun Tunnel, whose device takes a /24 of the target's host's addresses; the client dials the target's address, and the echo and bulk flows share that one Tunnel (under auto, its learned shape too), where other paths have a TCP Tunnel per target port. "+
		"The hosts' TCP buffers (this machine's, which namespaces copy, unless -wmem set them): %s.\n\n",
		o.bulk, o.streams, o.bulk8, o.echoes, o.size, together, o.warm, len(g.legs), buffers())
	fmt.Fprintf(&b, "| hosts' CC | loss %% | path | 1 stream Mbit/s | × direct | %d streams Mbit/s | × direct | echo total s | × direct | echo p99 ms | first byte ms | TCP CC seen | auto took (echo; bulk) |\n", o.streams)
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for i := range rows {
		r := &rows[i]
		var direct *row
		for j := range rows {
			if d := &rows[j]; d.p.hops == 0 && d.cc == r.cc && d.loss == r.loss {
				direct = d
			}
		}
		ratio := func(v, d float64) string {
			if direct == nil || d <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2fx", v/d)
		}
		one := mbit(r.one, r.oneErr)
		eight := mbit(r.eight, r.eightErr)
		var total, p99, first, vsEcho string
		if r.echo.err != nil {
			total = fmt.Sprintf("failed after %d: %v", r.echo.done, r.echo.err)
			p99, first, vsEcho = "–", "–", "–"
		} else {
			total = fmt.Sprintf("%.1f", r.echo.total.Seconds())
			p99 = fmt.Sprintf("%.0f", ms(r.echo.p99))
			first = fmt.Sprintf("%.0f", ms(r.echo.first))
			vsEcho = "–"
			if direct != nil && direct.echo.err == nil {
				vsEcho = ratio(r.echo.total.Seconds(), direct.echo.total.Seconds())
			}
		}
		auto := "–"
		if r.p.transport == "auto" {
			auto = transports(r.autoEcho) + "; " + transports(r.autoBulk)
		}
		var vsOne, vsEight string = "–", "–"
		if direct != nil {
			vsOne, vsEight = ratio(r.one, direct.one), ratio(r.eight, direct.eight)
		}
		fmt.Fprintf(&b, "| %s | %g | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.cc, r.loss, r.p, one, vsOne, eight, vsEight, total, vsEcho, p99, first, or(r.tcpCC, "–"), auto)
	}
	autoRows(&b, rows, o.streams)
	if len(urows) > 0 {
		fmt.Fprintln(&b)
		udpTable(&b, o, urows)
	}
	fmt.Fprintln(&b, "<!-- wan:end -->")
	return b.String()
}

// buffers are the most TCP's autotuning gives a socket to send and to
// receive, which bound one stream on a long path.
func buffers() string {
	most := func(name string) string {
		if name == "tcp_wmem" && sendMax > 0 {
			return fmt.Sprintf("%g MiB (set by -wmem)", float64(sendMax)/(1<<20))
		}
		b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
		f := strings.Fields(string(b))
		if err != nil || len(f) != 3 {
			return "?"
		}
		v, _ := strconv.ParseFloat(f[2], 64)
		return fmt.Sprintf("%g MiB", v/(1<<20))
	}
	return fmt.Sprintf("at most %s to send (tcp_wmem), %s to receive (tcp_rmem)", most("tcp_wmem"), most("tcp_rmem"))
}

// autoRows is the table of what the relays chose under auto.
func autoRows(b *strings.Builder, rows []row, streams int) {
	var any bool
	for _, r := range rows {
		any = any || r.p.transport == "auto"
	}
	if !any {
		return
	}
	fmt.Fprintln(b, "\nUnder `transport: auto`, the flows each relay opened to the next (`hoplink_link_flows_total`, by transport and reason), and at the end each hop's bulk transport (`hoplink_link_transport_info`) and the goodput its relay measured per transport (Mbit/s):")
	fmt.Fprintln(b)
	fmt.Fprintf(b, "| hosts' CC | loss %% | path | echo's flows | bulk flows (1 + %d streams) | bulk transport at the end | goodput measured |\n", streams)
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		if r.p.transport != "auto" {
			continue
		}
		fmt.Fprintf(b, "| %s | %g | %s | %s | %s | %s | %s |\n", r.cc, r.loss, r.p, perHop(r.hops, r.autoEcho), perHop(r.hops, r.autoBulk), r.info, r.goodput)
	}
}

func mbit(v float64, err error) string {
	s := fmt.Sprintf("%.1f", v)
	if err != nil {
		s += " (" + err.Error() + ")"
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// marker names the part of -out a run writes: a UDP-only run has a table
// of its own, and leaves the TCP one alone.
func (o options) marker() string {
	if o.udp.only {
		return "wan-udp"
	}
	return "wan"
}

func writeBetween(path, marker, table string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	markers := regexp.MustCompile(`(?s)<!-- ` + marker + `:begin -->.*?<!-- ` + marker + `:end -->\n?`)
	if !markers.Match(doc) {
		return fmt.Errorf("%s has no <!-- %s:begin --> marker", path, marker)
	}
	return os.WriteFile(path, markers.ReplaceAllLiteral(doc, []byte(table)), 0o644)
}
