package relay

import (
	"cmp"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/udpio"
	"github.com/hoplink/hoplink/srcaddr"
)

// listen opens a UDP Tunnel's sockets on its entry relay, one per address
// (entryListen); stop closes them and ends their sessions. The sockets
// share one table of sessions and its bounds.
func (f *udpFlows) listen(t *v1alpha1.Tunnel, addrs []string, loopbacks bool) (stop func(), bound []string, err error) {
	lns, bound, err := listenEach(addrs, loopbacks, func(addr string) (*net.UDPConn, error) {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, err
		}
		return pc.(*net.UDPConn), nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, ln := range lns {
		sizeUDP(ln)
	}
	u := &udpEntry{
		f: f, t: t, key: manifest.Key(t.Namespace, t.Name), lns: lns,
		idle:     time.Duration(t.Spec.UDP.IdleTimeoutSeconds) * time.Second,
		max:      int(t.Spec.UDP.MaxSessions),
		allowed:  allowedSources(t),
		sessions: map[netip.AddrPort]*udpSession{},
		perHost:  map[netip.Prefix]int{},
		scanned:  map[netip.Prefix]int64{},
		stop:     make(chan struct{}),
	}
	f.spawn(u.serve)
	return u.close, bound, nil
}

// udpEntry is a UDP Tunnel's socket on its entry relay, and its sessions.
type udpEntry struct {
	f    *udpFlows
	t    *v1alpha1.Tunnel
	key  string
	lns  []*net.UDPConn
	idle time.Duration
	max  int
	// allowed says whether a client host may start a session.
	allowed func(netip.Addr) bool

	drops sync.Map // reason -> prometheus.Counter

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	perHost  map[netip.Prefix]int // sessions by client host (srcaddr.Key)
	// scanned is when a host at its share last had no quiet session to
	// give up: its new sources are refused without a scan until
	// evictIdle/4 later, so a flood costs one scan per window, not one
	// per packet.
	scanned map[netip.Prefix]int64
	closed  bool
	stop    chan struct{}
}

type udpSession struct {
	u      *udpEntry
	ln     *net.UDPConn // the entry's socket the client sends to
	client netip.AddrPort
	last   atomic.Int64 // unix nanos of the last packet either way
	fc     flowCounters

	// Set once the session is connected; until then packets queue.
	ready atomic.Bool
	queue chan []byte
	out   nexthop.Session // the next relay
	local *net.UDPConn    // the target, when the entry is also the exit
	proxy []byte          // the PROXY header each datagram to local starts with
	// fair holds what goes to the next relay to the Tunnel's share of
	// that link; leave ends its part there, once (the session may end
	// while it connects).
	fair  *fairDatagrams
	leave atomic.Pointer[func()]
	// closer is what end must close: the next relay's session or the
	// local socket, set by connect. A session may end while it connects
	// (evicted, the entry closing); whichever of end and connect comes
	// second closes it, as with leave.
	closer atomic.Pointer[func(hop.Code)]

	once  sync.Once
	ended atomic.Bool // this relay ended it: its hop's end is no error
	done  func()
}

func (u *udpEntry) close() {
	u.mu.Lock()
	u.closed = true
	sessions := make([]*udpSession, 0, len(u.sessions))
	for _, s := range u.sessions {
		sessions = append(sessions, s)
	}
	u.mu.Unlock()
	close(u.stop)
	for _, ln := range u.lns {
		ln.Close()
	}
	for _, s := range sessions {
		s.end(hop.CodeShutdown)
	}
}

// flushBatches: a session's frames wait for the socket to run dry, or for
// this many read batches at most (32 datagrams; Frames flushes at 32 KiB
// anyway), so that a busy Tunnel sends its frames in large writes without
// holding a quiet session's packet behind a flood.
const flushBatches = 4

func (u *udpEntry) serve() {
	go u.reap()
	for _, ln := range u.lns[1:] {
		u.f.spawn(func() { u.read(ln) })
	}
	u.read(u.lns[0])
}

// read serves the clients of one of the entry's sockets.
func (u *udpEntry) read(ln *net.UDPConn) {
	r := udpio.NewReader(ln)
	// The sessions a batch sent to, flushed after it: in stream mode their
	// frames leave together.
	var sent []*udpSession
	up := u.f.limits.of(u.t).upLimiter()
	deliver := func(p []byte, from netip.AddrPort) {
		s := u.session(from, ln)
		if s == nil {
			return
		}
		// After admission: datagrams of sources the Tunnel refuses take
		// nothing of its rate.
		if !allow(up, len(p)) {
			u.dropped("rate_limit")
			return
		}
		s.touch()
		s.send(p)
		if s.ready.Load() && !slices.Contains(sent, s) {
			sent = append(sent, s)
		}
	}
	batches := 0
	for {
		more, err := r.Read(deliver)
		if batches++; more && err == nil && batches < flushBatches {
			continue // more is waiting: let the frames fill
		}
		batches = 0
		for i, s := range sent {
			s.flush()
			sent[i] = nil
		}
		sent = sent[:0]
		if err != nil {
			if errorsIsClosed(err) {
				return
			}
			u.f.log.Warn("udp read failed", "tunnel", u.key, "err", err)
			time.Sleep(time.Millisecond) // an error that repeats must not spin
		}
	}
}

// dropped counts a client packet dropped for reason. Its counter is
// resolved once per reason: a flood is counted packet by packet.
func (u *udpEntry) dropped(reason string) {
	if c, ok := u.drops.Load(reason); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := u.f.m.UDPDropped.WithLabelValues(u.f.name, u.key, reason)
	u.drops.Store(reason, c)
	c.Inc()
}

// Under pressure a UDP Tunnel's sessions make room for new clients: one
// host holds at most a sixteenth of them (at least 16), and when the table
// is full the sessions idle for evictIdle or more are ended, the idlest
// first, up to evictBatch at a time (so that a flood of new sources costs
// one scan per batch, not per packet).
const (
	evictIdle  = time.Second
	evictBatch = 64
	maxScanned = 4096 // hosts remembered as having no quiet session
)

func perHostSessions(sessions int) int { return min(sessions, max(sessions/16, 16)) }

// session finds or starts the session of a client address, which sent
// to socket ln (its replies leave there).
func (u *udpEntry) session(from netip.AddrPort, ln *net.UDPConn) *udpSession {
	u.mu.Lock()
	if s := u.sessions[from]; s != nil {
		u.mu.Unlock()
		return s
	}
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	host := from.Addr().Unmap()
	if !u.allowed(host) {
		u.mu.Unlock()
		u.dropped(sourceNotAllowed)
		return nil
	}
	src := srcaddr.Key(host)
	var evicted []*udpSession
	if u.perHost[src] >= perHostSessions(u.max) {
		// A host at its share makes room from its own quiet sessions, as
		// a full table does from everyone's: a burst of one-datagram
		// sources (a scan, a NAT's many users) locks its host's next
		// client out for a second at most, not for the idle timeout.
		now := time.Now().UnixNano()
		if now-u.scanned[src] > int64(evictIdle/4) {
			evicted = u.idlestLocked(src)
			for _, s := range evicted {
				u.forgetLocked(s)
			}
			if len(evicted) == 0 {
				if len(u.scanned) >= maxScanned {
					clear(u.scanned)
				}
				u.scanned[src] = now
			}
		}
		if u.perHost[src] >= perHostSessions(u.max) {
			u.mu.Unlock()
			u.dropped("source_limit")
			u.f.warn.Warn("udp session refused: its client's host holds its share of the Tunnel's sessions, all active in the last second",
				"tunnel", u.key, "host", src.String(), "share", perHostSessions(u.max))
			return nil
		}
	}
	if len(u.sessions) >= u.max {
		more := u.idlestLocked(netip.Prefix{})
		for _, s := range more {
			u.forgetLocked(s)
		}
		evicted = append(evicted, more...)
	}
	f := u.f
	if len(u.sessions) >= u.max || !f.acquire(u.key, host) {
		u.mu.Unlock()
		u.endAll(evicted)
		u.dropped("session_limit")
		return nil
	}
	fc, done := f.begin(u.key, "entry")
	gauge := f.m.UDPSessions.WithLabelValues(f.name, u.key, "entry")
	gauge.Inc()
	s := &udpSession{u: u, ln: ln, client: from, fc: fc, queue: make(chan []byte, pendingPackets)}
	s.done = func() {
		done()
		gauge.Dec()
		f.release(u.key, host)
	}
	s.touch()
	u.sessions[from] = s
	u.perHost[src]++
	u.mu.Unlock()
	u.endAll(evicted)
	f.spawn(s.connect)
	return s
}

// idlestLocked picks the sessions to evict from a full table, or from
// host's share when host is valid.
func (u *udpEntry) idlestLocked(host netip.Prefix) []*udpSession {
	cutoff := time.Now().Add(-evictIdle).UnixNano()
	var idle []*udpSession
	for _, s := range u.sessions {
		if s.last.Load() <= cutoff && (!host.IsValid() || srcaddr.Key(s.client.Addr()) == host) {
			idle = append(idle, s)
		}
	}
	slices.SortFunc(idle, func(a, b *udpSession) int { return cmp.Compare(a.last.Load(), b.last.Load()) })
	return idle[:min(len(idle), evictBatch)]
}

// forgetLocked takes a session out of the table.
func (u *udpEntry) forgetLocked(s *udpSession) {
	if u.sessions[s.client] != s {
		return
	}
	delete(u.sessions, s.client)
	src := srcaddr.Key(s.client.Addr())
	if u.perHost[src]--; u.perHost[src] <= 0 {
		delete(u.perHost, src)
	}
}

func (u *udpEntry) endAll(evicted []*udpSession) {
	for _, s := range evicted {
		u.f.flowError(u.key, "evicted")
		s.end(hop.CodeIdle)
	}
}

func (s *udpSession) touch() { s.last.Store(time.Now().UnixNano()) }

// send forwards one client packet, or queues it while connecting.
func (s *udpSession) send(p []byte) {
	if !s.ready.Load() {
		select {
		case s.queue <- append([]byte(nil), p...):
		default:
			s.u.dropped("queue_full")
		}
		return
	}
	s.forward(p)
}

func (s *udpSession) forward(p []byte) {
	var err error
	if s.local != nil && s.proxy != nil {
		_, err = s.local.Write(append(s.proxy[:len(s.proxy):len(s.proxy)], p...))
	} else if s.local != nil {
		_, err = s.local.Write(p)
	} else {
		if !s.fair.admit(len(p)) {
			return
		}
		s.fair.start()
		err = s.out.Send(p)
		s.fair.end(sentLen(p, err))
	}
	if err != nil {
		s.failed(err)
		return
	}
	s.fc.up.Add(float64(len(p)))
}

// sentLen is what a send of p handed over: nothing when it failed.
func sentLen(p []byte, err error) int {
	if err != nil {
		return 0
	}
	return len(p)
}

// flush sends the frames a session in stream mode queued.
func (s *udpSession) flush() {
	if s.out != nil {
		s.fair.start()
		err := s.out.Flush()
		s.fair.end(0)
		if err != nil {
			s.failed(err)
		}
	}
}

// stallAfter bounds a write of a session's frames at the entry: a next hop
// that takes none of them for this long is taken for stalled.
const stallAfter = time.Second

// failed counts a packet the session could not send; a stalled write ends
// the session (its stream may hold part of a frame), and the client's next
// packet starts another.
func (s *udpSession) failed(err error) {
	s.u.dropped("send_failed")
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.u.f.flowError(s.u.key, "stalled")
		s.u.f.warn.Warn("udp session ended: its next hop took no frames", "tunnel", s.u.key, "client", s.client.String(), "within", stallAfter)
		s.end(hop.CodeReset)
	}
}

// reply hands a packet from the chain back to the client.
func (s *udpSession) reply(p []byte) {
	s.touch()
	if _, err := s.ln.WriteToUDPAddrPort(p, s.client); err == nil {
		s.fc.down.Add(float64(len(p)))
	}
}

func (s *udpSession) connect() {
	u, f := s.u, s.u.f
	ctx, cancel := f.setupContext()
	defer cancel()
	chain, route, err := f.routes.routeOf(ctx, u.t)
	if err != nil {
		f.hopFailed(u.key, err)
		s.end(hop.CodeNextHop)
		return
	}
	if len(route) == 1 {
		c, err := dialUDP(f.egress, u.t.Spec.Target)
		if err != nil {
			if egress.IsRefused(err) {
				f.dialFailed(u.key, u.t.Spec.Target, err)
			} else {
				f.flowError(u.key, "dial_target")
			}
			s.end(hop.CodeDialFailed)
			return
		}
		s.local = c
		if s.closeOnEnd(func(hop.Code) { c.Close() }) {
			return
		}
		client, listener := proxyAddrs(u.t, net.UDPAddrFromAddrPort(s.client), s.ln.LocalAddr())
		s.proxy = proxyHeader(u.t, true, client, listener)
		s.markReady()
		buf := make([]byte, hop.MaxFrame)
		down, overRate := f.downRate(u.t)
		for {
			n, err := c.Read(buf)
			if err != nil {
				s.end(hop.CodeReset)
				return
			}
			if !allow(down, n) {
				overRate.Inc()
				continue
			}
			s.reply(buf[:n])
		}
	}
	h := &hop.Header{Kind: hop.KindUDP, Tunnel: u.key, Route: route[1:], Target: u.t.Spec.Target}
	h.Client, h.Listener = proxyAddrs(u.t, net.UDPAddrFromAddrPort(s.client), s.ln.LocalAddr())
	var mode v1alpha1.UDPMode
	if u.t.Spec.UDP != nil {
		mode = u.t.Spec.UDP.Mode
	}
	next, err := f.hops.Open(ctx, h, nexthop.OpenOptions{Transport: chain.Spec.Transport, UDPMode: mode})
	cancel()
	if err != nil {
		f.hopFailed(u.key, err)
		s.end(hop.CodeNextHop)
		return
	}
	framed := f.framed(u.key, "entry", s.client.String())
	fair, share, leave := f.shareDatagrams(u.t, next.Peer)
	leave = sync.OnceFunc(leave)
	s.fair = fair
	s.leave.Store(&leave)
	if s.ended.Load() {
		leave()
	}
	s.out = next.Session(nexthop.SessionOptions{
		Share: share,
		Mode:  udpMode(u.t),
		Bulk: func(turned bool) {
			if turned {
				framed()
			}
			f.hops.UDPBulk(u.key)
		},
		// The Tunnel's read loop writes every session's frames: a write
		// that stalls (its next hop stopped reading) fails after
		// stallAfter and ends its session, so that the loop goes on for
		// the others.
		Stall: stallAfter,
	})
	out := s.out
	if s.closeOnEnd(out.End) {
		return
	}
	s.out.Receive(s.reply)
	s.markReady()
	// The stream carries (oversize) replies; its end is the session's end.
	err = s.out.ReadFrames(s.reply, nil)
	if s.ended.Load() {
		return
	}
	if hopBroken(err) {
		f.flowError(u.key, sideNextHop)
		s.end(hop.CodeReset)
		return
	}
	s.end(hop.CodeIdle) // the exit ended it: an end, passed on as one
}

// closeOnEnd has end close what connect opened, and says whether the
// session already ended: then it is closed here, and connect stops.
func (s *udpSession) closeOnEnd(c func(hop.Code)) (ended bool) {
	s.closer.Store(&c)
	if s.ended.Load() {
		c(hop.CodeReset)
		return true
	}
	return false
}

// markReady drains packets that queued while connecting, then lets the
// read loop send directly. Packets keep their order: the read loop only
// switches to direct sends after the queue is flushed here.
func (s *udpSession) markReady() {
	defer s.flush()
	for {
		select {
		case p := <-s.queue:
			s.forward(p)
		default:
			s.ready.Store(true)
			// A packet may have been queued between the empty check and the
			// store; flush it too.
			for {
				select {
				case p := <-s.queue:
					s.forward(p)
				default:
					return
				}
			}
		}
	}
}

// end closes the session once, at this relay and, through its stream, at
// every hop after it.
func (s *udpSession) end(code hop.Code) {
	s.once.Do(func() {
		s.ended.Store(true)
		u := s.u
		// Packets still queued were waiting for a session that will
		// never carry them (no route, the next hop or target refused).
		for n := len(s.queue); n > 0; n-- {
			select {
			case <-s.queue:
				u.dropped("setup_failed")
			default:
			}
		}
		u.mu.Lock()
		u.forgetLocked(s)
		u.mu.Unlock()
		if c := s.closer.Load(); c != nil {
			(*c)(code)
		}
		if leave := s.leave.Load(); leave != nil {
			(*leave)()
		}
		s.done()
	})
}

// reap ends sessions idle for longer than the Tunnel's idle timeout.
func (u *udpEntry) reap() {
	every := min(u.idle/4, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-u.stop:
			return
		case now := <-t.C:
			var idle []*udpSession
			u.mu.Lock()
			for _, s := range u.sessions {
				if now.Sub(time.Unix(0, s.last.Load())) > u.idle {
					idle = append(idle, s)
				}
			}
			u.mu.Unlock()
			for _, s := range idle {
				s.end(hop.CodeIdle)
			}
		}
	}
}
