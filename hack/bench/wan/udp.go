//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/manifest"
)

// The UDP rows: a sender on the client's host paces datagrams at a rate,
// a receiver on the target's host counts them and their lag behind
// schedule. Both run in this process, so one monotonic clock (epoch on)
// stamps a datagram's scheduled send time and its arrival.

// udpPort is the UDP receiver's port on the target's host; a relay path's
// UDP Tunnel listens at tunnelAddr(i, udpPort).
const udpPort = 7002

// A datagram starts with the magic, the measurement's id, its sequence
// number (probeBit set: a probe, not counted), its scheduled send time and
// the time it was handed to the kernel, in nanoseconds since epoch; the
// rest is padding up to -udp-size. The lag is behind the schedule; the
// path's own lag, behind the send, tells a sender that fell behind (a
// busy machine) from a slow path.
const (
	udpMagic  = 0x686c7775 // "hlwu"
	udpHeader = 32
	probeBit  = 1 << 63
)

var epoch = time.Now()

func sinceEpoch() time.Duration { return time.Since(epoch) }

type udpOptions struct {
	rates []float64 // Mbit/s
	d     time.Duration
	size  int
	mode  string // spec.udp.mode, "" for the Tunnel's default
	only  bool   // skip the TCP measurements
}

// parseRates reads -udp: Mbit/s figures, each above 0.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range split(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("-udp %q: want rates in Mbit/s, such as 1,4,16", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// checkUDP validates the UDP flags together.
func checkUDP(u udpOptions) error {
	switch u.mode {
	case "", "auto", "datagram", "stream":
	default:
		return fmt.Errorf("-udp-mode %q: auto, datagram or stream", u.mode)
	}
	if u.size < udpHeader || u.size > 65507 {
		return fmt.Errorf("-udp-size %d: from %d to 65507 bytes", u.size, udpHeader)
	}
	if u.d <= 0 {
		return fmt.Errorf("-udp-time %v: want a positive duration", u.d)
	}
	if u.only && len(u.rates) == 0 {
		return errors.New("-udp-only without -udp rates measures nothing")
	}
	return nil
}

// udpPaths are the paths the UDP rows measure: all but tun ones.
func udpPaths(ps []path) []int {
	var out []int
	for i, p := range ps {
		if !p.tun {
			out = append(out, i)
		}
	}
	return out
}

// schedule is the number of datagrams of size bytes a sender sends at
// mbps for d, and the interval between their scheduled send times.
func schedule(mbps float64, size int, d time.Duration) (n int, every time.Duration) {
	perSecond := mbps * 1e6 / float64(size*8)
	n = int(math.Round(perSecond * d.Seconds()))
	return max(n, 1), time.Duration(float64(time.Second) / perSecond)
}

// due is how many of n datagrams, one every interval from start, are due
// at now.
func due(start, now, every time.Duration, n int) int {
	if now < start {
		return 0
	}
	return min(n, int((now-start)/every)+1)
}

// percentile is the q-th (0 < q <= 1) of sorted, by nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

type udpResult struct {
	sent, got, dups int
	late            int // unique datagrams that came after the window
	delivered       float64
	p50, p99        time.Duration
	behind          time.Duration // most the sender was behind schedule
	// pathP50 is the p50 of arrival less actual send time; slowWrite and
	// slowSleep the longest one write and one millisecond's sleep took.
	pathP50              time.Duration
	slowWrite, slowSleep time.Duration
	sendErrs             int
	// copies: datagrams the relays sent twice, in percent of those sent
	// times the hops (the bandwidth loss repair added between relays).
	copies        float64
	drops, kernel string
	err           error
}

// summarize turns what a receiver saw into the row's figures: delivered
// is unique datagrams over those sent, in percent; lags are the unique
// datagrams' (sorted here).
func summarize(sent int, lags []time.Duration, dups int) udpResult {
	slices.Sort(lags)
	r := udpResult{sent: sent, got: len(lags), dups: dups}
	if sent > 0 {
		r.delivered = 100 * float64(len(lags)) / float64(sent)
	}
	r.p50, r.p99 = percentile(lags, 0.5), percentile(lags, 0.99)
	return r
}

// udpCollector is one measurement at the receiver.
type udpCollector struct {
	run    uint32
	n      int
	seen   []bool
	lags   []time.Duration
	path   []time.Duration // arrival less actual send time
	dups   int
	late   int
	closed bool
	probe  chan struct{}
}

type udpReceiver struct {
	c    *net.UDPConn
	mu   sync.Mutex
	cur  *udpCollector
	last atomic.Int64 // arrival of the latest datagram, since epoch
}

// listenUDP opens the receiver on node's every address.
func listenUDP(node *linkemu.Node) (*udpReceiver, error) {
	var c *net.UDPConn
	err := node.Do(func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: udpPort})
		return err
	})
	if err != nil {
		return nil, err
	}
	// Room for a burst of stragglers: what the receiver's socket drops
	// would pass for the path's loss. As root past rmem_max.
	forceBuffer(c, unix.SO_RCVBUFFORCE, 16<<20)
	r := &udpReceiver{c: c}
	go r.serve()
	return r, nil
}

func forceBuffer(c *net.UDPConn, opt, bytes int) {
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, bytes) })
	}
}

func (r *udpReceiver) serve() {
	buf := make([]byte, 65536)
	for {
		n, err := r.c.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		at := sinceEpoch()
		if n < udpHeader || binary.BigEndian.Uint32(buf) != udpMagic {
			continue
		}
		r.last.Store(int64(at))
		run := binary.BigEndian.Uint32(buf[4:])
		seq := binary.BigEndian.Uint64(buf[8:])
		sched := time.Duration(binary.BigEndian.Uint64(buf[16:]))
		sent := time.Duration(binary.BigEndian.Uint64(buf[24:]))
		r.mu.Lock()
		if c := r.cur; c != nil && c.run == run {
			c.add(seq, at-sched, at-sent)
		}
		r.mu.Unlock()
	}
}

// add counts a datagram of the measurement that lagged lag behind its
// schedule and path behind its send.
func (c *udpCollector) add(seq uint64, lag, path time.Duration) {
	switch {
	case seq&probeBit != 0:
		select {
		case c.probe <- struct{}{}:
		default:
		}
	case seq >= uint64(c.n):
	case c.seen[seq]:
		c.dups++
	case c.closed:
		c.seen[seq] = true
		c.late++
	default:
		c.seen[seq] = true
		c.lags = append(c.lags, lag)
		c.path = append(c.path, path)
	}
}

func (r *udpReceiver) start(run uint32, n int) *udpCollector {
	c := &udpCollector{run: run, n: n, seen: make([]bool, n), lags: make([]time.Duration, 0, n), path: make([]time.Duration, 0, n), probe: make(chan struct{}, 1)}
	r.mu.Lock()
	r.cur = c
	r.mu.Unlock()
	return c
}

// close ends a measurement's window: later datagrams count as late.
func (r *udpReceiver) close(c *udpCollector) (lags, path []time.Duration, dups int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.closed = true
	return slices.Clone(c.lags), slices.Clone(c.path), c.dups
}

// late is how many unique datagrams of the latest measurement came after
// its window.
func (r *udpReceiver) late() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return 0
	}
	return r.cur.late
}

// quiet waits until no datagram came for gap, at most within.
func (r *udpReceiver) quiet(gap, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if sinceEpoch()-time.Duration(r.last.Load()) >= gap {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var runs atomic.Uint32

// measureUDP sends from node to addr at mbps for u.d, from a socket of its
// own (a new session at the relays), after probes show the path carries
// datagrams; then waits wait for stragglers.
func measureUDP(node *linkemu.Node, addr string, recv *udpReceiver, mbps float64, u udpOptions, wait time.Duration) (r udpResult) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		r.err = err
		return r
	}
	var c *net.UDPConn
	if err := node.Do(func() (err error) { c, err = net.DialUDP("udp", nil, raddr); return err }); err != nil {
		r.err = err
		return r
	}
	defer c.Close()
	forceBuffer(c, unix.SO_SNDBUFFORCE, 4<<20)
	n, every := schedule(mbps, u.size, u.d)
	run := runs.Add(1)
	col := recv.start(run, n)
	buf := make([]byte, u.size)
	binary.BigEndian.PutUint32(buf, udpMagic)
	binary.BigEndian.PutUint32(buf[4:], run)
	put := func(seq uint64, sched time.Duration) error {
		binary.BigEndian.PutUint64(buf[8:], seq)
		binary.BigEndian.PutUint64(buf[16:], uint64(sched))
		t := sinceEpoch()
		binary.BigEndian.PutUint64(buf[24:], uint64(t))
		_, err := c.Write(buf)
		r.slowWrite = max(r.slowWrite, sinceEpoch()-t)
		return err
	}
	// Probes until one arrives: the session is set up through the relays
	// before the schedule starts, so its setup is no datagram's lag.
	probed := false
	deadline := time.Now().Add(30 * time.Second)
	for i := uint64(0); !probed && time.Now().Before(deadline); i++ {
		put(probeBit|i, sinceEpoch())
		select {
		case <-col.probe:
			probed = true
		case <-time.After(200 * time.Millisecond):
		}
	}
	r.slowWrite = 0
	if !probed {
		recv.close(col)
		r.err = errors.New("no probe crossed within 30s")
		return r
	}
	// Send what is due, then sleep about a millisecond: a small machine
	// cannot sleep thousands of times a second on time, and the schedule,
	// not the sleeps, sets the rate.
	start := sinceEpoch() + time.Millisecond
	sent := 0
	for sent < n {
		now := sinceEpoch()
		for d := due(start, now, every, n); sent < d; sent++ {
			sched := start + time.Duration(sent)*every
			r.behind = max(r.behind, now-sched)
			if err := put(uint64(sent), sched); err != nil {
				r.sendErrs++
			}
		}
		if sent < n {
			t := sinceEpoch()
			time.Sleep(time.Millisecond)
			r.slowSleep = max(r.slowSleep, sinceEpoch()-t)
		}
	}
	time.Sleep(wait)
	lags, path, dups := recv.close(col)
	res := summarize(n, lags, dups)
	slices.Sort(path)
	res.pathP50 = percentile(path, 0.5)
	res.behind, res.sendErrs, res.slowWrite, res.slowSleep = r.behind, r.sendErrs, r.slowWrite, r.slowSleep
	return res
}

// udpDrop is a relay's hoplink_udp_dropped_packets_total sample.
type udpDrop struct{ relay, tunnel, reason string }

// udpDropsSince are the datagrams the relays dropped since before, of
// tunnel or of no Tunnel (a relay's datagrams from peers), by relay and
// reason: "seattle queue_full 120, la no_session 2"; "none" for none.
func udpDropsSince(before, after map[udpDrop]float64, tunnel string) string {
	var parts []string
	for k, v := range after {
		if k.tunnel != tunnel && k.tunnel != "" {
			continue
		}
		if d := v - before[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %s %.0f", k.relay, k.reason, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// udpSocketDrops are each host's kernel UDP counters of datagrams no
// socket took (RcvbufErrors: a full receive buffer; SndbufErrors), from
// /proc/net/snmp inside its namespace.
func udpSocketDrops(nodes []*linkemu.Node) map[string][2]int64 {
	out := map[string][2]int64{}
	for _, node := range nodes {
		b, err := node.Command("cat", "/proc/net/snmp").Output()
		if err != nil {
			continue
		}
		if v, ok := snmpUDP(string(b)); ok {
			out[node.Name] = v
		}
	}
	return out
}

// snmpUDP reads RcvbufErrors and SndbufErrors of the Udp lines of
// /proc/net/snmp.
func snmpUDP(text string) (v [2]int64, ok bool) {
	var names []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if i >= len(f) {
				break
			}
			n, _ := strconv.ParseInt(f[i], 10, 64)
			switch name {
			case "RcvbufErrors":
				v[0], ok = n, true
			case "SndbufErrors":
				v[1] = n
			}
		}
		return v, ok
	}
	return v, false
}

// socketDropsSince names the hosts whose sockets dropped datagrams since
// before: "useast rcvbuf 12"; "" for none.
func socketDropsSince(before, after map[string][2]int64, names []string) string {
	var parts []string
	for _, name := range names {
		a, ok := after[name]
		if !ok {
			continue
		}
		b := before[name]
		if d := a[0] - b[0]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s rcvbuf %d", name, d))
		}
		if d := a[1] - b[1]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s sndbuf %d", name, d))
		}
	}
	return strings.Join(parts, ", ")
}

// udpRow is one path's figures at one rate.
type udpRow struct {
	cc   string
	loss float64
	p    path
	rate float64 // Mbit/s
	udpResult
}

// senderLate is how far behind schedule a sender may fall (a burst of
// what fell due during a millisecond's sleep on a busy machine) before
// its row says so.
const senderLate = 50 * time.Millisecond

// pathRTT is the round trip of path p's links.
func pathRTT(g geography, p path) time.Duration {
	if p.hops <= 1 {
		return g.direct
	}
	var rtt time.Duration
	for _, l := range g.legs {
		rtt += l
	}
	return rtt
}

// udpRows measures every path that is not tun at every -udp rate, one
// after another (they share links). After each it waits for the path to
// fall quiet (a backlog's late datagrams counted apart), then reads the
// relays' drop counters.
func udpRows(o options, nw *network, cc string, loss float64, settle time.Duration) []udpRow {
	var out []udpRow
	for _, i := range udpPaths(o.paths) {
		p := o.paths[i]
		addr := nw.pathAddr(i, p, udpPort)
		tunnel := manifest.Key(manifest.DefaultNamespace, udpTunnel(i))
		wait := 2*time.Second + pathRTT(o.g, p)
		for _, rate := range o.udp.rates {
			time.Sleep(settle)
			before, kb := nw.snapshot(), udpSocketDrops(nw.nodes)
			res := measureUDP(nw.nodes[0], addr, nw.udp, rate, o.udp, wait)
			nw.udp.quiet(time.Second, 15*time.Second)
			res.late = nw.udp.late()
			after, ka := nw.snapshot(), udpSocketDrops(nw.nodes)
			res.drops = "–"
			if p.hops > 0 {
				res.drops = udpDropsSince(before.udpDrops, after.udpDrops, tunnel)
				if res.sent > 0 {
					res.copies = 100 * (after.copies - before.copies) / float64(res.sent*p.hops)
				}
			}
			res.kernel = socketDropsSince(kb, ka, o.g.names)
			r := udpRow{cc: cc, loss: loss, p: p, rate: rate, udpResult: res}
			out = append(out, r)
			if res.err != nil {
				fmt.Fprintf(os.Stderr, "%s | %g%% | %-13s | udp %g Mbit/s | failed: %v\n", cc, loss, p, rate, res.err)
				continue
			}
			fmt.Fprintf(os.Stderr, "%s | %g%% | %-13s | udp %g Mbit/s | delivered %.1f%% (%d of %d, %d dup, %d late) | lag p50 %v p99 %v (behind the send: p50 %v) | copies %.1f%% | relays' drops %s | sockets %s | sender behind ≤ %v (slowest write %v, 1ms sleep %v), %d send errors\n",
				cc, loss, p, rate, res.delivered, res.got, res.sent, res.dups, res.late,
				res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond), res.pathP50.Round(time.Millisecond), res.copies, res.drops, or(res.kernel, "none"),
				res.behind.Round(time.Millisecond), res.slowWrite.Round(time.Microsecond), res.slowSleep.Round(time.Microsecond), res.sendErrs)
		}
	}
	return out
}

// udpTable is the UDP rows' table, after a paragraph that says how they
// were measured.
func udpTable(b *strings.Builder, o options, rows []udpRow) {
	if len(rows) == 0 {
		return
	}
	mode := "its default `udp.mode`"
	if o.udp.mode != "" {
		mode = fmt.Sprintf("`udp.mode: %s`", o.udp.mode)
	}
	fmt.Fprintf(b, "UDP, one path and rate at a time: a sender on the client's host paces %d-byte datagrams (UDP payload) at the rate for %v, "+
		"from a socket of its own (a new session), once probes have crossed the path; relay paths go through a UDP Tunnel of their Chain (%s), "+
		"direct straight to the receiver on the target's host. **Delivered**: unique datagrams received within the sending time and 2 s and the path's round trip after, over those sent "+
		"(**late**: unique ones that came later still, before the path fell quiet; **dup**: copies of one already received). "+
		"**Lag**: arrival less the datagram's scheduled send time (one clock: sender and receiver are one process), p50 and p99 of the delivered by nearest rank. "+
		"**Copies**: datagrams the relays sent twice for loss (`hoplink_udp_datagram_copies_total`), in percent of those sent times the relay hops: what loss repair added to the links between relays. "+
		"**Drops**: the relays' `hoplink_udp_dropped_packets_total` (the Tunnel's, and a relay's own from peers) by relay and reason, and datagrams a host's kernel dropped at a full socket buffer, if any.\n\n",
		o.udp.size, o.udp.d, mode)
	fmt.Fprintln(b, "| hosts' CC | loss % | path | rate Mbit/s | delivered % | p50 lag ms | p99 lag ms | dup | late | copies % | drops |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		if r.err != nil {
			fmt.Fprintf(b, "| %s | %g | %s | %g | failed: %v | – | – | – | – | – | %s |\n", r.cc, r.loss, r.p, r.rate, r.err, r.drops)
			continue
		}
		drops := r.drops
		if r.kernel != "" {
			drops += "; sockets: " + r.kernel
		}
		if r.behind > senderLate {
			// The lag then counts the sender's own lateness too.
			drops += fmt.Sprintf("; the sender fell up to %.0f ms behind schedule (p50 lag behind the send %.0f ms)", ms(r.behind), ms(r.pathP50))
		}
		lag := func(d time.Duration) string {
			if r.got == 0 {
				return "–"
			}
			return fmt.Sprintf("%.0f", ms(d))
		}
		copies := "–"
		if r.p.hops > 0 {
			copies = fmt.Sprintf("%.1f", r.copies)
		}
		fmt.Fprintf(b, "| %s | %g | %s | %g | %.1f | %s | %s | %d | %d | %s | %s |\n",
			r.cc, r.loss, r.p, r.rate, r.delivered, lag(r.p50), lag(r.p99), r.dups, r.late, copies, drops)
	}
}
