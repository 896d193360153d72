package relay

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// A UDP session is one client address of a UDP Tunnel. Its packets ride
// QUIC datagrams keyed by the session stream's id; the stream itself marks
// the session's life (closing it ends the session at every hop) and carries
// packets too large for a datagram, as length-prefixed frames, so nothing
// is dropped for size.

// pendingPackets bounds what a session queues while its stream is opening.
const pendingPackets = 32

// packetSender sends a session's packets over one hop: as datagrams when
// they fit the connection's current datagram size, else as frames on the
// session's stream. Datagram limits differ per connection (path MTU
// discovery runs on each), so every hop decides again.
type packetSender struct {
	c  *rquic.Conn
	s  *quicgo.Stream
	id uint64

	mu    sync.Mutex // serializes frame writes to s
	frame []byte
}

func newPacketSender(c *rquic.Conn, s *quicgo.Stream) *packetSender {
	return &packetSender{c: c, s: s, id: uint64(s.StreamID())}
}

// mss is the TCP MSS whose segments (of this IP packet's version) fill one
// datagram of this hop: a full-size segment then makes a full-size QUIC
// packet, which keeps quic-go's GSO batches going.
func (p *packetSender) mss(ipPacket []byte) uint16 {
	hdr := 20
	if len(ipPacket) > 0 && ipPacket[0]>>4 == 6 {
		hdr = 40
	}
	return uint16(max(p.c.MaxDatagram()-quicvarint.Len(p.id)-hdr-20, 536))
}

func (p *packetSender) send(b []byte) error {
	err := p.c.SendFlowDatagram(p.id, b)
	var tooLarge *quicgo.DatagramTooLargeError
	if !errors.As(err, &tooLarge) {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frame == nil {
		p.frame = make([]byte, 0, 2+hop.MaxFrame)
	}
	return hop.WriteFrame(p.s, p.frame, b)
}

// readFrames hands every packet framed on s to deliver until s ends.
func readFrames(s *quicgo.Stream, deliver func([]byte)) error {
	buf := make([]byte, hop.MaxFrame)
	for {
		p, err := hop.ReadFrame(s, buf)
		if err != nil {
			return err
		}
		deliver(p)
	}
}

type udpEntry struct {
	r    *Relay
	t    *v1alpha1.Tunnel
	key  string
	ln   *net.UDPConn
	idle time.Duration
	max  int

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	closed   bool
	stop     chan struct{}
}

type udpSession struct {
	u      *udpEntry
	client netip.AddrPort
	last   atomic.Int64 // unix nanos of the last packet either way
	fm     flowMetrics

	// Set once the session is connected; until then packets queue.
	ready atomic.Bool
	queue chan []byte
	out   *packetSender
	local *net.UDPConn // the target, when the entry is also the exit

	once sync.Once
	done func()
}

func newUDPEntry(r *Relay, t *v1alpha1.Tunnel, ln *net.UDPConn) *udpEntry {
	return &udpEntry{
		r: r, t: t, key: manifest.Key(t.Namespace, t.Name), ln: ln,
		idle:     time.Duration(t.Spec.UDP.IdleTimeoutSeconds) * time.Second,
		max:      int(t.Spec.UDP.MaxSessions),
		sessions: map[netip.AddrPort]*udpSession{},
		stop:     make(chan struct{}),
	}
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
	u.ln.Close()
	for _, s := range sessions {
		s.end(hop.CodeShutdown)
	}
}

func (u *udpEntry) serve() {
	go u.reap()
	buf := make([]byte, hop.MaxFrame)
	for {
		n, from, err := u.ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errorsIsClosed(err) {
				return
			}
			u.r.cfg.Log.Warn("udp read failed", "tunnel", u.key, "err", err)
			continue
		}
		s := u.session(from)
		if s == nil {
			continue
		}
		s.touch()
		s.send(buf[:n])
	}
}

func (u *udpEntry) dropped(reason string) {
	u.r.cfg.Metrics.UDPDropped.WithLabelValues(u.r.cfg.Name, u.key, reason).Inc()
}

// session finds or starts the session of a client address.
func (u *udpEntry) session(from netip.AddrPort) *udpSession {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s := u.sessions[from]; s != nil {
		return s
	}
	if u.closed {
		return nil
	}
	if len(u.sessions) >= u.max || !u.r.acquire() {
		u.dropped("session_limit")
		return nil
	}
	fm, done := u.r.begin(u.key, "entry")
	gauge := u.r.cfg.Metrics.UDPSessions.WithLabelValues(u.r.cfg.Name, u.key, "entry")
	gauge.Inc()
	s := &udpSession{u: u, client: from, fm: fm, queue: make(chan []byte, pendingPackets)}
	s.done = func() {
		done()
		gauge.Dec()
		u.r.release()
	}
	s.touch()
	u.sessions[from] = s
	u.r.wg.Add(1)
	go func() {
		defer u.r.wg.Done()
		s.connect()
	}()
	return s
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
	if s.local != nil {
		_, err = s.local.Write(p)
	} else {
		err = s.out.send(p)
	}
	if err != nil {
		s.u.dropped("send_failed")
		return
	}
	s.fm.up.Add(float64(len(p)))
}

// reply hands a packet from the chain back to the client.
func (s *udpSession) reply(p []byte) {
	s.touch()
	if _, err := s.u.ln.WriteToUDPAddrPort(p, s.client); err == nil {
		s.fm.down.Add(float64(len(p)))
	}
}

func (s *udpSession) connect() {
	u := s.u
	ctx, cancel := u.r.setupContext()
	defer cancel()
	var route []string
	chain := u.r.set.Load().ChainOf(u.t)
	err := errors.New("the Tunnel's chain is gone")
	if chain != nil {
		route, err = u.r.routeOf(ctx, chain)
	}
	if err != nil {
		u.r.flowError(u.key, "no_route")
		u.r.cfg.Log.Warn("no route for session", "tunnel", u.key, "err", err)
		s.end(hop.CodeNextHop)
		return
	}
	if len(route) == 1 {
		raddr, err := net.ResolveUDPAddr("udp", u.t.Spec.Target)
		var c *net.UDPConn
		if err == nil {
			c, err = net.DialUDP("udp", nil, raddr)
		}
		if err == nil {
			sizeUDP(c)
		}
		if err != nil {
			u.r.flowError(u.key, "dial_target")
			s.end(hop.CodeDialFailed)
			return
		}
		s.local = c
		s.markReady()
		buf := make([]byte, hop.MaxFrame)
		for {
			n, err := c.Read(buf)
			if err != nil {
				s.end(hop.CodeReset)
				return
			}
			s.reply(buf[:n])
		}
	}
	conn, st, err := u.r.nextHop(ctx, &hop.Header{Kind: hop.KindUDP, Tunnel: u.key, Route: route[1:], Target: u.t.Spec.Target})
	cancel()
	if err != nil {
		u.r.flowError(u.key, "next_hop")
		u.r.cfg.Log.Warn("next hop unavailable", "tunnel", u.key, "next", route[1], "err", err)
		s.end(hop.CodeNextHop)
		return
	}
	s.out = newPacketSender(conn, st)
	conn.Register(s.out.id, s.reply)
	s.markReady()
	// The stream carries oversize replies; its end is the session's end.
	readFrames(st, s.reply)
	s.end(hop.CodeReset)
}

// markReady drains packets that queued while connecting, then lets the
// read loop send directly. Packets keep their order: the read loop only
// switches to direct sends after the queue is flushed here.
func (s *udpSession) markReady() {
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
func (s *udpSession) end(code quicgo.StreamErrorCode) {
	s.once.Do(func() {
		u := s.u
		u.mu.Lock()
		if u.sessions[s.client] == s {
			delete(u.sessions, s.client)
		}
		u.mu.Unlock()
		if s.local != nil {
			s.local.Close()
		}
		if s.out != nil {
			s.out.c.Unregister(s.out.id)
			resetStream(s.out.s, code)
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

// middleUDP joins a session's two hops. Packets are re-keyed to the next
// connection's flow id and re-sent as datagram or frame as that hop allows.
func (r *Relay) middleUDP(c *rquic.Conn, s *quicgo.Stream, nc *rquic.Conn, ns *quicgo.Stream, tunnel string, fm flowMetrics) {
	gauge := r.cfg.Metrics.UDPSessions.WithLabelValues(r.cfg.Name, tunnel, "middle")
	gauge.Inc()
	defer gauge.Dec()
	back, onward := newPacketSender(c, s), newPacketSender(nc, ns)
	relay := func(out *packetSender, n prometheus.Counter) func([]byte) {
		return func(p []byte) {
			if err := out.send(p); err != nil {
				r.cfg.Metrics.UDPDropped.WithLabelValues(r.cfg.Name, tunnel, "send_failed").Inc()
				return
			}
			n.Add(float64(len(p)))
		}
	}
	up, down := relay(onward, fm.up), relay(back, fm.down)
	nc.Register(onward.id, down)
	c.Register(back.id, up)
	defer nc.Unregister(onward.id)
	defer c.Unregister(back.id)
	done := make(chan struct{}, 2)
	go func() { readFrames(s, up); done <- struct{}{} }()
	go func() { readFrames(ns, down); done <- struct{}{} }()
	<-done // either side's end ends the session on both
	resetStream(s, hop.CodeReset)
	resetStream(ns, hop.CodeReset)
	<-done
}

// exitUDP ends a session at its target: a connected UDP socket per session.
func (r *Relay) exitUDP(c *rquic.Conn, s *quicgo.Stream, h *hop.Header, t *v1alpha1.Tunnel) {
	fm, done := r.begin(h.Tunnel, "exit")
	defer done()
	start := time.Now()
	raddr, err := net.ResolveUDPAddr("udp", h.Target)
	var tc *net.UDPConn
	if err == nil {
		tc, err = net.DialUDP("udp", nil, raddr)
	}
	if err == nil {
		sizeUDP(tc)
	}
	if err != nil {
		r.flowError(h.Tunnel, "dial_target")
		r.cfg.Log.Warn("cannot reach target", "tunnel", h.Tunnel, "target", h.Target, "err", err)
		resetStream(s, hop.CodeDialFailed)
		return
	}
	r.cfg.Metrics.FlowSetup.WithLabelValues(r.cfg.Name, h.Tunnel, "exit").Observe(time.Since(start).Seconds())
	gauge := r.cfg.Metrics.UDPSessions.WithLabelValues(r.cfg.Name, h.Tunnel, "exit")
	gauge.Inc()
	defer gauge.Dec()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	out := newPacketSender(c, s)
	c.Register(out.id, func(p []byte) {
		last.Store(time.Now().UnixNano())
		if _, err := tc.Write(p); err == nil {
			fm.up.Add(float64(len(p)))
		}
	})
	defer c.Unregister(out.id)

	// Stream frames (oversize packets) toward the target; the stream's end
	// ends the session.
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		readFrames(s, func(p []byte) {
			last.Store(time.Now().UnixNano())
			if _, err := tc.Write(p); err == nil {
				fm.up.Add(float64(len(p)))
			}
		})
	}()
	// Replies from the target. The idle timeout also holds here, so an exit
	// never keeps a session whose entry vanished.
	idle := udpIdle(t)
	buf := make([]byte, hop.MaxFrame)
	for {
		tc.SetReadDeadline(time.Now().Add(min(idle, time.Second)))
		n, err := tc.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			if out.send(buf[:n]) == nil {
				fm.down.Add(float64(n))
			}
		}
		select {
		case <-streamDone:
			tc.Close()
			resetStream(s, hop.CodeReset)
			return
		default:
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			break
		}
		if time.Since(time.Unix(0, last.Load())) > idle {
			break
		}
	}
	tc.Close()
	resetStream(s, hop.CodeIdle)
	<-streamDone
}

// udpSocketBuffer is the kernel buffer of every tunnel socket. A client that sends in bursts
// outruns a relay busy forwarding the previous burst; the kernel's default (about 200 KiB)
// overflows in under 2 ms at 1 Gbit/s. The kernel caps it at net.core.rmem_max/wmem_max.
const udpSocketBuffer = 4 << 20

func sizeUDP(c *net.UDPConn) {
	_ = c.SetReadBuffer(udpSocketBuffer)
	_ = c.SetWriteBuffer(udpSocketBuffer)
}

// udpIdle is how long a UDP session of the Tunnel lives without traffic:
// its spec's, or the default for a tun Tunnel's UDP flows.
func udpIdle(t *v1alpha1.Tunnel) time.Duration {
	if t.Spec.UDP != nil && t.Spec.UDP.IdleTimeoutSeconds > 0 {
		return time.Duration(t.Spec.UDP.IdleTimeoutSeconds) * time.Second
	}
	return v1alpha1.DefaultUDPIdleTimeout * time.Second
}
