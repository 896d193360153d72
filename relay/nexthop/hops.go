package nexthop

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/relay/tlslink"
)

// Hops opens hops to peers for headers: a stream on a QUIC link or a
// connection from a TLS pool, over the chain's transport or, under auto,
// this relay's choice for the link, with one set of errors. The entries of
// every protocol, middle relays, traces and link requests all open hops
// here.
type Hops struct {
	p    *Peers // the links and pools it opens hops on, bound by Listen
	name string
	m    *metrics.Metrics
	log  *slog.Logger

	spread sync.Map  // peer with replicas -> *atomic.Uint64, its round-robin turn
	auto   *chooser  // shared with Peers, which forgets relays that leave
	shares tlsShares // TLS flows open under auto
	live   liveTCP   // the TCP connections of TLS flows open, per peer
}

func newHops(p *Peers, o Options, auto *chooser) *Hops {
	hs := &Hops{p: p, name: o.Name, m: o.Metrics, log: o.Log, auto: auto}
	hs.auto.changed = hs.transportChanged
	hs.auto.goodput = func(peer string, t v1alpha1.Transport, bps float64) {
		if hs.m != nil {
			hs.m.LinkGoodput.WithLabelValues(hs.name, peer, string(t)).Set(bps)
		}
	}
	return hs
}

// class is the link a header's stream rides: its Tunnel's own for flows
// and sessions, the control link for traces and link requests.
func class(h *hop.Header) string {
	switch h.Kind {
	case hop.KindTrace, hop.KindLinks:
		return rquic.Control
	}
	return h.Tunnel
}

// refuseDraining fails a flow whose next hop drains, at once: waiting
// would only end in its refusal.
func (hs *Hops) refuseDraining(next string) error {
	if hs.p.Draining(next) {
		return &Error{Reason: NextHop, Next: next, Err: ErrDraining}
	}
	return nil
}

// Onward is the header a relay sends on: h for the rest of the route.
func Onward(h *hop.Header) *hop.Header {
	next := *h
	next.Route = h.Route[1:]
	return &next
}

// OpenOptions say how Open opens a hop.
type OpenOptions struct {
	// Transport is the chain's: quic, tls, or auto (this relay's choice
	// for the link and the flow's shape).
	Transport v1alpha1.Transport
	// UDPMode is a new UDP session's Tunnel's udp.mode, at its entry.
	UDPMode v1alpha1.UDPMode
	// Came is, at a middle relay, the transport a UDP or packet session
	// came in on: it goes on over the same (a session framed on a byte
	// stream stays on TLS, one on QUIC keeps its datagrams).
	Came v1alpha1.Transport
	// Live opens the hop only on a QUIC connection up now: a link
	// request, which a round sends another way rather than wait.
	Live bool
}

// Open opens a hop to h.Route[0] and sends it h, over the transport o and
// the header's kind decide: a TCP flow or a trace over the chain's
// transport (under auto this relay's choice, which the Hop's Choice says
// and learns from), a UDP or packet session at its entry by its Tunnel's
// shape and at a middle over the transport it came on, a link request
// over QUIC.
func (hs *Hops) Open(ctx context.Context, h *hop.Header, o OpenOptions) (*Hop, error) {
	if o.Live {
		return hs.openLive(ctx, h)
	}
	if err := hs.refuseDraining(h.Route[0]); err != nil {
		return nil, err
	}
	switch {
	case h.Kind != hop.KindUDP && h.Kind != hop.KindPacket && h.Kind != hop.KindEcho:
		return hs.openFlow(ctx, h, o.Transport)
	case o.Came == v1alpha1.TransportTLS:
		return hs.openTLS(ctx, h, tlsOpen{})
	case o.Came != "":
		return hs.openSession(ctx, h)
	case h.Kind == hop.KindUDP:
		return hs.openUDP(ctx, h, o.Transport, o.UDPMode)
	}
	// A packet session at its entry. Its sessions are few and long, and
	// not counted in a Tunnel's share of TLS flows.
	if hs.choose(h, o.Transport).Transport == v1alpha1.TransportTLS {
		return hs.openTLS(ctx, h, tlsOpen{})
	}
	return hs.openSession(ctx, h)
}

// openFlow opens a hop for a TCP flow, a trace or a link request: over the
// chain's transport, or under auto this relay's choice for the link.
func (hs *Hops) openFlow(ctx context.Context, h *hop.Header, transport v1alpha1.Transport) (*Hop, error) {
	ch := hs.choose(h, transport)
	var out *Hop
	var err error
	if ch.Transport == v1alpha1.TransportTLS {
		// Under auto a Tunnel's TLS flows are bounded; the chain's own
		// choice of TLS is not.
		if transport == v1alpha1.TransportAuto && h.Kind == hop.KindTCP {
			var shared bool
			if out, shared, err = hs.openTLSShared(ctx, h, ch.spareOnly, ch.Reason == ReasonLongInteractive); !shared {
				ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonTLSShare
			}
		} else {
			out, err = hs.openTLS(ctx, h, tlsOpen{spareOnly: ch.spareOnly})
		}
		if ch.Transport == v1alpha1.TransportTLS && out == nil && err == nil {
			// A flow of unknown shape in a burst: rather than wait for a
			// handshake, it rides QUIC.
			ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonNoSpare
		}
	}
	if ch.Transport != v1alpha1.TransportTLS {
		out, err = hs.openStream(ctx, h)
	}
	if err != nil {
		if ch.meter != nil {
			hs.auto.unwatch(ch.shape, ch.meter)
		}
		return nil, err
	}
	ch.out = out.end
	out.Choice = ch
	if h.Kind == hop.KindTCP {
		hs.countFlow(ch.peer, ch.Transport, ch.Reason)
	}
	return out, nil
}

func (hs *Hops) openStream(ctx context.Context, h *hop.Header) (*Hop, error) {
	c, s, err := hs.stream(ctx, h) // Open checked the next hop already
	if err != nil {
		return nil, err
	}
	out := flow.HeldStream(c.Conn, s, c.Hold())
	// The header is the flow's first bytes, so it waits for the window as
	// they do (flow.Window): a client that waits for its target to speak
	// first sends no others. Not past the setup's deadline.
	if d, ok := ctx.Deadline(); ok {
		s.SetWriteDeadline(d)
		defer s.SetWriteDeadline(time.Time{})
	}
	if err := writeHeader(out, h); err != nil {
		out.Fail(hop.CodeNextHop)
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: err}
	}
	return quicHop(c, s, out), nil
}

// tlsOpen is how openTLS takes its connection.
type tlsOpen struct {
	// spareOnly takes a ready connection or none (nil, nil); quick also
	// one dialed now if the pool has a handshake slot free
	// (tlslink.Pool.Quick).
	spareOnly, quick bool
	// buffer, when not 0, is the socket's send and receive buffer, fixed.
	buffer int
	// ended runs when the flow's connection is finished.
	ended func()
}

// openTLS takes a TLS connection to h.Route[0] and sends it h.
func (hs *Hops) openTLS(ctx context.Context, h *hop.Header, o tlsOpen) (*Hop, error) {
	next := h.Route[0]
	peer, ok := hs.p.peer(next)
	if !ok {
		return nil, unknown(next)
	}
	get := func(pool *tlslink.Pool) (*tls.Conn, error) {
		switch {
		case o.quick:
			return pool.Quick(ctx), nil
		case o.spareOnly:
			return pool.Spare(), nil
		}
		return pool.Get(ctx)
	}
	var c *tls.Conn
	var err error
	if !peer.Replicas {
		c, err = get(hs.p.pools.Pool(peer.Name, peer.Endpoints))
	} else {
		// A replica that refuses (it died a moment ago: TCP says so at
		// once) costs a try, not the flow: the next replica gets it.
		for range max(1, len(peer.replicas())) {
			r, perr := hs.replica(peer)
			if perr != nil {
				return nil, perr
			}
			if c, err = get(hs.p.pools.Replica(peer.Name, r.Name, r.Endpoints)); (err == nil && c != nil) || ctx.Err() != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, &Error{Reason: NextHop, Next: next, Err: err}
	}
	if c == nil {
		return nil, nil
	}
	var out *flow.TLSEnd
	live := false
	out = flow.TLS(c, func() {
		if live {
			hs.live.remove(next, out)
		}
		hs.p.tls.Done(c)
		if o.ended != nil {
			o.ended()
		}
	})
	if tcp := out.TCP(); tcp != nil {
		if o.buffer > 0 {
			tcp.SetReadBuffer(o.buffer)
			tcp.SetWriteBuffer(o.buffer)
		}
		live = true
		hs.live.add(next, out)
	}
	if err := writeHeader(out, h); err != nil {
		out.Abort()
		return nil, &Error{Reason: NextHop, Next: next, Err: err}
	}
	return tlsHop(next, c.RemoteAddr(), out), nil
}

// openSession opens a QUIC stream to h.Route[0] for a UDP or packet
// session, and sends it h.
func (hs *Hops) openSession(ctx context.Context, h *hop.Header) (*Hop, error) {
	c, s, err := hs.stream(ctx, h)
	if err != nil {
		return nil, err
	}
	return sendHeader(c, s, h)
}

// sendHeader writes h as the first bytes of s, a new stream of c, and
// makes the stream a Hop; a stream it cannot write to is reset.
func sendHeader(c *rquic.Conn, s *quicgo.Stream, h *hop.Header) (*Hop, error) {
	if err := writeHeader(s, h); err != nil {
		flow.Reset(s, hop.CodeNextHop)
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: err}
	}
	return quicHop(c, s, flow.Stream(s)), nil
}

// stream opens a QUIC stream to h.Route[0], on the link of h's class.
func (hs *Hops) stream(ctx context.Context, h *hop.Header) (*rquic.Conn, *quicgo.Stream, error) {
	next := h.Route[0]
	peer, ok := hs.p.peer(next)
	if !ok {
		return nil, nil, unknown(next)
	}
	link, err := hs.link(peer, class(h))
	if err != nil {
		return nil, nil, err
	}
	c, s, err := link.OpenStream(ctx)
	if err != nil {
		return nil, nil, &Error{Reason: NextHop, Next: next, Err: fmt.Errorf("open stream: %w", err)}
	}
	return c, s, nil
}

// openLive opens a stream to h.Route[0] only if its connection is up now.
func (hs *Hops) openLive(ctx context.Context, h *hop.Header) (*Hop, error) {
	c := hs.p.links.Live(h.Route[0])
	if c == nil {
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: rquic.ErrPeerDown}
	}
	s, err := c.OpenFlow(ctx)
	if err != nil {
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: fmt.Errorf("open stream: %w", err)}
	}
	return sendHeader(c, s, h)
}

// link is the QUIC link a new stream of class to peer takes. A peer with
// replicas (a sidecar relay) spreads new streams over its ready replicas
// in turn, preferring those connected now; a stream, and so a UDP or
// packet session, stays on the replica it opened on.
func (hs *Hops) link(peer Peer, class string) (*rquic.Link, error) {
	if !peer.Replicas {
		return hs.p.links.Link(peer.Name, class, peer.Endpoints), nil
	}
	r, err := hs.replica(peer)
	if err != nil {
		return nil, err
	}
	return hs.p.links.Replica(peer.Name, class, r.Name, r.Endpoints), nil
}

// replica picks the replica of a sidecar peer a new flow goes to: the next
// in turn that is connected and has not been seen lost, else the next.
func (hs *Hops) replica(peer Peer) (Replica, error) {
	rs := peer.replicas()
	if len(rs) == 0 {
		return Replica{}, &Error{Reason: NextHop, Next: peer.Name, Err: fmt.Errorf("sidecar relay %q has no ready replica", peer.Name)}
	}
	v, _ := hs.spread.LoadOrStore(peer.Name, new(atomic.Uint64))
	turn := v.(*atomic.Uint64).Add(1)
	pick := rs[turn%uint64(len(rs))]
	for i := range rs {
		if r := rs[(turn+uint64(i))%uint64(len(rs))]; hs.p.links.ReplicaUp(peer.Name, r.Name) {
			pick = r
			break
		}
	}
	return pick, nil
}

// writeHeader sends a header in one write, so that it leaves with the
// flow's first bytes.
func writeHeader(w interface{ Write([]byte) (int, error) }, h *hop.Header) error {
	var buf [hop.PrefixLen + hop.MaxBodyLen]byte
	b, err := h.Append(buf[:0])
	if err == nil {
		_, err = w.Write(b)
	}
	return err
}

// The hops peers open: their headers read here, for either transport,
// before the Upper sees them.

// Inbound is what a peer opened: its header, read here (bounded in size
// and time), and the hop it came on. The Upper admits it or refuses it
// (Hop.Refuse).
type Inbound struct {
	Header hop.Header
	Hop    *Hop
}

// HeaderTimeout bounds how long a peer may take to send a hop's header.
const HeaderTimeout = 10 * time.Second

// MaxPendingHeaders bounds the streams one QUIC connection may have
// waiting for their header: a stream holds no flow token until its header
// is read, so a peer sending half headers would otherwise hold a goroutine
// and buffers per stream for HeaderTimeout, without bound. It is a
// connection's, not a peer's: a peer's connections are its Tunnels' links,
// and one of them full of half headers must not refuse the streams of the
// others. The connections a peer may hold are bounded too
// (rquic.Options.MaxConns); TLS bounds its own (tlslink's waiting).
const MaxPendingHeaders = 256

// pending counts the streams of each QUIC connection waiting for their
// header.
type pending struct {
	mu sync.Mutex
	n  map[*rquic.Conn]int
}

// await takes a slot for a stream of c to wait for its header in.
func (p *pending) await(c *rquic.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[c] >= MaxPendingHeaders {
		return false
	}
	if p.n == nil {
		p.n = map[*rquic.Conn]int{}
	}
	p.n[c]++
	return true
}

func (p *pending) done(c *rquic.Conn) {
	p.mu.Lock()
	if p.n[c]--; p.n[c] <= 0 {
		delete(p.n, c)
	}
	p.mu.Unlock()
}

// Serve reads the header of a stream a peer opened and hands the hop up.
func (u fromQUIC) Serve(c *rquic.Conn, s *quicgo.Stream) {
	p := u.p
	if !p.headers.await(c) {
		p.refused(c.Peer, c.RemoteAddr(), "header_limit", errors.New("too many streams waiting for their header"))
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Now().Add(HeaderTimeout))
	h, err := hop.Read(s)
	p.headers.done(c)
	if _, _, reset := flow.ResetCode(err); reset {
		// The flow ended before its header arrived (a client that gave up
		// at once): nothing hostile, nothing to count.
		flow.Reset(s, hop.CodeReset)
		return
	}
	if err != nil {
		p.refused(c.Peer, c.RemoteAddr(), "bad_header", err)
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Time{})
	end := flow.Stream(s)
	if h.Kind == hop.KindTCP {
		// A TCP flow's first writes wait for the connection's window, and
		// the connection stays while it runs when its peer drains.
		end = flow.HeldStream(c.Conn, s, nil)
		defer c.Hold()()
	}
	p.up.Serve(Inbound{Header: h, Hop: quicHop(c, s, end)})
}

// Serve reads the header of the flow a peer sent on a TLS connection (the
// endpoint set the read deadline that bounds it) and hands the hop up.
func (u fromTLS) Serve(peer string, c *tls.Conn) {
	p := u.p
	end := flow.TLS(c, func() { p.tls.Done(c) })
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		end.Abort() // a spare the peer retired unused, or a peer gone
		return
	}
	h, err := hop.Read(io.MultiReader(bytes.NewReader(first[:]), c))
	if err != nil {
		p.refused(peer, c.RemoteAddr(), "bad_header", err)
		end.Abort()
		return
	}
	p.tls.Started(c)
	c.SetReadDeadline(time.Time{})
	p.up.Serve(Inbound{Header: h, Hop: tlsHop(peer, c.RemoteAddr(), end)})
}
