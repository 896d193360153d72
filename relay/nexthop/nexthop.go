// Package nexthop is how a relay reaches the next relay of a route. Peers
// owns the relay's QUIC and TLS endpoints: it accepts its peers' streams
// (handing them to the relay's dispatcher), keeps its links up, and opens a
// hop for a header, over the chain's transport, with one set of errors. The
// entries of every protocol, middle relays, traces and link requests all
// open hops here.
package nexthop

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/relay/tlslink"
)

// Router knows the routes of chains.
type Router interface {
	// Route returns the route new flows of chain c take; a routed chain
	// without one yet is waited for until ctx ends. A route that crosses
	// a relay avoid names (one that drains; the next hop also when it is
	// down) is not taken: a routed chain waits for a round to find another,
	// a chain with a fixed route fails at once.
	Route(ctx context.Context, c *v1alpha1.Chain, avoid func(relay string, next bool) bool) ([]string, error)
}

// Options configure Peers.
type Options struct {
	Name     string
	Identity *pki.Identity
	// Listen is the relay's host:port, for QUIC on UDP and TLS on TCP.
	Listen string
	// SeparateDialPort is rquic.Options'.
	SeparateDialPort bool
	// Manifests returns the manifests in force now.
	Manifests func() *manifest.Set
	Router    Router
	// Stream serves a stream a peer opened over QUIC; TLS one a TLS
	// connection (whose read deadline bounds the wait for its header).
	Stream func(c *rquic.Conn, s *quicgo.Stream)
	TLS    func(peer string, c *tls.Conn)
	// Admin serves the admin API on the TLS port.
	Admin       http.Handler
	OnProbeEcho func(peer string, payload []byte)
	// OnPeerDraining is told when a peer says it drains: it takes no new
	// flows, and new flows fail at once rather than try it.
	OnPeerDraining func(peer string)
	// OnRejected is told of every peer handshake refused, QUIC or TLS.
	OnRejected func(remote net.Addr, err error)
	// Congestion is the TCP congestion control of the TLS links.
	Congestion tlslink.Congestion
	Metrics    *metrics.Metrics
	Log        *slog.Logger
}

// Peers is a relay's side of its links to other relays.
type Peers struct {
	o    Options
	quic *rquic.Endpoint
	tls  *tlslink.Endpoint

	spread sync.Map // peer with replicas -> *atomic.Uint64, its round-robin turn
	auto   *chooser

	tlsMu    sync.Mutex
	tlsFlows map[tlsShare]int // TLS flows open under auto

	live liveTCP // the TCP connections of TLS flows open, per peer
}

// tlsShare is what maxTLSFlowsPerTunnel counts: a Tunnel's flows to a peer.
type tlsShare struct{ peer, tunnel string }

// takeTLS takes a slot of the Tunnel's share of TLS flows to peer, or
// says there is none left.
func (p *Peers) takeTLS(k tlsShare) bool {
	p.tlsMu.Lock()
	defer p.tlsMu.Unlock()
	if p.tlsFlows[k] >= maxTLSFlowsPerTunnel {
		return false
	}
	if p.tlsFlows == nil {
		p.tlsFlows = map[tlsShare]int{}
	}
	p.tlsFlows[k]++
	return true
}

func (p *Peers) giveTLS(k tlsShare) {
	p.tlsMu.Lock()
	defer p.tlsMu.Unlock()
	if p.tlsFlows[k] <= 1 {
		delete(p.tlsFlows, k)
		return
	}
	p.tlsFlows[k]--
}

// New makes a relay's Peers; Listen binds them. The two steps let the
// roles that serve peers' streams hold the Peers before the first stream
// arrives.
func New(o Options) *Peers {
	p := &Peers{o: o, auto: newChooser()}
	p.auto.changed = p.transportChanged
	p.auto.goodput = func(peer string, t v1alpha1.Transport, bps float64) {
		if o.Metrics != nil {
			o.Metrics.LinkGoodput.WithLabelValues(o.Name, peer, string(t)).Set(bps)
		}
	}
	return p
}

// Listen binds the relay's QUIC and TLS listeners on the same port number.
func (p *Peers) Listen() error {
	o := p.o
	known := func(name string) bool { return o.Manifests().Relay(name) != nil }
	q, err := rquic.Listen(rquic.Options{Name: o.Name, Identity: o.Identity, Listen: o.Listen, KnownPeer: known, SeparateDialPort: o.SeparateDialPort,
		Handler: o.Stream, OnProbeEcho: o.OnProbeEcho, OnPeerDraining: o.OnPeerDraining, OnRejected: o.OnRejected, OnPeerLost: p.peerLost,
		MaxConns: func(peer string) int { return maxConns(o.Manifests(), o.Name, peer) },
		Metrics:  o.Metrics, Log: o.Log})
	if err != nil {
		return err
	}
	t, err := tlslink.Listen(tlslink.Options{Name: o.Name, Identity: o.Identity, Listen: o.Listen, KnownPeer: known,
		Handler: o.TLS, Admin: o.Admin, OnRejected: o.OnRejected, Congestion: o.Congestion, Metrics: o.Metrics, Log: o.Log})
	if err != nil {
		q.Close()
		return err
	}
	p.quic, p.tls = q, t
	return nil
}

// Addr is the bound QUIC address.
func (p *Peers) Addr() net.Addr { return p.quic.Addr() }

// Close ends every connection, in and out.
func (p *Peers) Close() error {
	if p.quic == nil {
		return nil
	}
	return errors.Join(p.tls.Close(), p.quic.Close())
}

// SetCongestion makes TLS links made from now on run c's algorithm.
func (p *Peers) SetCongestion(c tlslink.Congestion) { p.tls.SetCongestion(c) }

// TLSDone tells the TLS endpoint that a connection it accepted is closed.
func (p *Peers) TLSDone(c *tls.Conn) { p.tls.Done(c) }

// TLSStarted tells the TLS endpoint that a connection it accepted has sent
// its header: it no longer waits, and is not closed to make room.
func (p *Peers) TLSStarted(c *tls.Conn) { p.tls.Started(c) }

// Connect starts the links (and warms the TLS pools) of every peer the
// manifests route this relay's flows to, and gives existing links their
// peers' current endpoints.
func (p *Peers) Connect(set *manifest.Set) {
	p.auto.forget(func(peer string) bool {
		if set.Relay(peer) != nil {
			return true
		}
		if m := p.o.Metrics; m != nil {
			for _, v := range []interface {
				DeletePartialMatch(prometheus.Labels) int
			}{m.LinkTransport, m.LinkGoodput, m.LinkFlows} {
				v.DeletePartialMatch(prometheus.Labels{"from": p.o.Name, "to": peer})
			}
		}
		return false
	})
	for _, peer := range set.NextHops(p.o.Name) {
		rn := set.Relay(peer)
		if rn.Spec.IsSidecar() {
			// A control link to every ready replica: it tells which are up.
			for _, addr := range rn.Spec.Endpoints {
				p.quic.Replica(peer, rquic.Control, addr)
			}
			p.quic.Retire(peer, rn.Spec.Endpoints)
			p.tls.Retire(peer, rn.Spec.Endpoints)
			continue
		}
		p.quic.Link(peer, rquic.Control, rn.Spec.Endpoints)
		p.quic.SetAddrs(peer, rn.Spec.Endpoints)
	}
	for _, c := range set.Chains {
		if c.Spec.Transport == v1alpha1.TransportQUIC {
			continue
		}
		var next []string
		route := manifest.Route(c)
		if i := slices.Index(route, p.o.Name); i >= 0 && i+1 < len(route) {
			next = append(next, route[i+1])
		}
		if c.Spec.Mode.Routed() {
			next = append(next, manifest.NextHopsOf(c, p.o.Name)...)
		}
		for _, peer := range next {
			if rn := set.Relay(peer); rn.Spec.IsSidecar() {
				for _, addr := range rn.Spec.Endpoints {
					p.tls.Replica(peer, addr) // warm them now
				}
			} else {
				p.tls.Pool(peer, rn.Spec.Endpoints) // warm it now
			}
		}
	}
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

// ErrDraining is a next hop that drains: it takes no new flows.
var ErrDraining = errors.New("the relay is draining (shutting down): it takes no new flows")

// Drain tells the peers that this relay takes no new flows.
func (p *Peers) Drain() { p.quic.Drain() }

// Settle waits, after a drain saw its last flow end, until the peers
// closed their QUIC connections (they do once they read what this relay
// sent) or ctx ends; it returns how many were still up.
func (p *Peers) Settle(ctx context.Context) int { return p.quic.Settle(ctx) }

// Draining reports whether a peer (every replica of a sidecar peer) said
// it drains.
func (p *Peers) Draining(peer string) bool {
	r := p.o.Manifests().Relay(peer)
	if r == nil || !r.Spec.IsSidecar() {
		return p.quic.PeerDraining(peer)
	}
	for _, a := range r.Spec.Endpoints {
		if !p.quic.ReplicaDraining(peer, a) {
			return false
		}
	}
	return len(r.Spec.Endpoints) > 0
}

// Recheck closes the connections, QUIC and TLS, whose peer no longer
// holds: its certificate expired, or (full) the manifests no longer name
// it; with full, TLS sessions made under the previous CAs stop resuming.
func (p *Peers) Recheck(full bool) int {
	return p.quic.Recheck(full) + p.tls.Recheck(full)
}

// Answering records whether peer answered the last round of link probes
// (see rquic.Endpoint.Answering).
func (p *Peers) Answering(peer string, ok bool) { p.quic.Answering(peer, ok) }

// peerLost ends the TLS flows of a peer whose QUIC control connection
// timed out: it stopped answering (a host lost, a process hung). QUIC's
// idle timeout ended its QUIC flows; TCP would keep TLS flows hanging for
// as long as its kernel acknowledges or its retransmissions last.
func (p *Peers) peerLost(peer string) {
	if n := p.tls.ClosePeer(peer); n > 0 && p.o.Log != nil {
		p.o.Log.Warn("peer stopped answering: its TLS flows end", "peer", peer, "flows", n)
	}
}

// unavailable reports a relay new flows should not be sent through: it
// drains, or, as this relay's next hop, it stopped answering. That this
// relay cannot reach a relay further on says nothing of the route: the
// relay before that one reaches it (a link cut between two relays).
func (p *Peers) unavailable(peer string, next bool) bool {
	return p.Draining(peer) || (next && p.quic.PeerDown(peer))
}

// refuseDraining fails a flow whose next hop drains, at once: waiting
// would only end in its refusal.
func (p *Peers) refuseDraining(next string) error {
	if p.Draining(next) {
		return &Error{Reason: NextHop, Next: next, Err: ErrDraining}
	}
	return nil
}

// Live returns the connection to a peer if it is up now, without waiting.
func (p *Peers) Live(peer string) *rquic.Conn { return p.quic.Live(peer) }

// Up says whether the link to peer carries new flows now: connected, not
// counted down, not draining.
func (p *Peers) Up(peer string) bool {
	return p.quic.Live(peer) != nil && !p.quic.PeerDown(peer) && !p.Draining(peer)
}

// Reasons of an Error: the reason label of hoplink_flow_errors_total.
const (
	NoRoute = "no_route"
	NextHop = "next_hop"
)

// Error is a flow that could not reach its next hop.
type Error struct {
	Reason string
	// Next is the relay that could not be reached, when one was chosen.
	Next string
	Err  error
}

func (e *Error) Error() string {
	if e.Next != "" {
		return fmt.Sprintf("next hop %s: %v", e.Next, e.Err)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrChainGone is a flow whose Tunnel's Chain left the manifests.
var ErrChainGone = errors.New("the Tunnel's chain is gone")

// Route returns the chain and route a new flow of Tunnel t takes.
func (p *Peers) Route(ctx context.Context, t *v1alpha1.Tunnel) (*v1alpha1.Chain, []string, error) {
	chain := p.o.Manifests().ChainOf(t)
	if chain == nil {
		return nil, nil, &Error{Reason: NoRoute, Err: ErrChainGone}
	}
	route, err := p.o.Router.Route(ctx, chain, p.unavailable)
	if err != nil {
		return nil, nil, &Error{Reason: NoRoute, Err: err}
	}
	return chain, route, nil
}

// Onward is the header a relay sends on: h for the rest of the route.
func Onward(h *hop.Header) *hop.Header {
	next := *h
	next.Route = h.Route[1:]
	return &next
}

// Open opens a hop to h.Route[0] and sends it h: a TCP flow, a trace, or a
// packet or UDP session over TLS. The chain's transport decides how, or
// under auto this relay's choice for the link; the Choice says which and
// takes the flow's figures back.
func (p *Peers) Open(ctx context.Context, h *hop.Header, transport v1alpha1.Transport) (flow.End, *Choice, error) {
	if err := p.refuseDraining(h.Route[0]); err != nil {
		return nil, nil, err
	}
	if h.Kind == hop.KindPacket || h.Kind == hop.KindUDP {
		// A session Open carries is framed for a byte stream (a middle
		// relay passes on one that came over TLS), which only TLS
		// carries: over QUIC a session is an rquic.Session (Session).
		transport = v1alpha1.TransportTLS
	}
	ch := p.choose(h, transport)
	var out flow.End
	var err error
	if ch.Transport == v1alpha1.TransportTLS {
		// Under auto a Tunnel's TLS flows are bounded; the chain's own
		// choice of TLS is not.
		if transport == v1alpha1.TransportAuto && h.Kind == hop.KindTCP {
			var shared bool
			if out, shared, err = p.openTLSShared(ctx, h, ch.spareOnly); !shared {
				ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonTLSShare
			}
		} else {
			out, err = p.openTLS(ctx, h, ch.spareOnly, func() {})
		}
		if ch.Transport == v1alpha1.TransportTLS && out == nil && err == nil {
			// A flow of unknown shape in a burst: rather than wait for a
			// handshake, it rides QUIC.
			ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonNoSpare
		}
	}
	if ch.Transport != v1alpha1.TransportTLS {
		out, err = p.openStream(ctx, h)
	}
	if err != nil {
		if ch.meter != nil {
			p.auto.unwatch(ch.shape, ch.meter)
		}
		return nil, nil, err
	}
	ch.out = out
	if h.Kind == hop.KindTCP {
		p.countFlow(ch.peer, ch.Transport, ch.Reason)
	}
	return out, ch, nil
}

func (p *Peers) openStream(ctx context.Context, h *hop.Header) (flow.End, error) {
	c, s, err := p.stream(ctx, h) // Open checked the next hop already
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
	return out, nil
}

// openTLSShared is openTLS within the share of TLS flows h's Tunnel has to
// the peer (maxTLSFlowsPerTunnel): shared is false, and nothing opened,
// when the share is taken; the flow gives its slot back when it ends.
func (p *Peers) openTLSShared(ctx context.Context, h *hop.Header, spareOnly bool) (out flow.End, shared bool, err error) {
	k := tlsShare{h.Route[0], h.Tunnel}
	if !p.takeTLS(k) {
		return nil, false, nil
	}
	release := sync.OnceFunc(func() { p.giveTLS(k) })
	if out, err = p.openTLS(ctx, h, spareOnly, release); out == nil {
		release()
	}
	return out, true, err
}

// openTLS takes a TLS connection to h.Route[0] and sends it h. With
// spareOnly it takes a ready one or none (nil, nil). ended runs when the
// flow's connection is finished.
func (p *Peers) openTLS(ctx context.Context, h *hop.Header, spareOnly bool, ended func()) (flow.End, error) {
	next := h.Route[0]
	peer := p.o.Manifests().Relay(next)
	if peer == nil {
		return nil, unknown(next)
	}
	get := func(pool *tlslink.Pool) (*tls.Conn, error) {
		if spareOnly {
			return pool.Spare(), nil
		}
		return pool.Get(ctx)
	}
	var c *tls.Conn
	var err error
	if !peer.Spec.IsSidecar() {
		c, err = get(p.tls.Pool(peer.Name, peer.Spec.Endpoints))
	} else {
		// A replica that refuses (it died a moment ago: TCP says so at
		// once) costs a try, not the flow: the next replica gets it.
		for range max(1, len(peer.Spec.Endpoints)) {
			addr, perr := p.replica(peer)
			if perr != nil {
				return nil, perr
			}
			if c, err = get(p.tls.Replica(peer.Name, addr)); (err == nil && c != nil) || ctx.Err() != nil {
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
	tc := tcpOf(c)
	if tc != nil {
		p.live.add(next, tc)
	}
	out := flow.TLS(c, func() {
		if tc != nil {
			p.live.remove(next, tc)
		}
		p.tls.Done(c)
		ended()
	})
	if err := writeHeader(out, h); err != nil {
		out.Abort()
		return nil, &Error{Reason: NextHop, Next: next, Err: err}
	}
	return out, nil
}

// Session opens a QUIC stream to h.Route[0] and sends it h: a datagram
// session (UDP, packets), or a TCP flow or trace over QUIC.
func (p *Peers) Session(ctx context.Context, h *hop.Header) (*rquic.Conn, *quicgo.Stream, error) {
	if err := p.refuseDraining(h.Route[0]); err != nil {
		return nil, nil, err
	}
	return p.session(ctx, h)
}

func (p *Peers) session(ctx context.Context, h *hop.Header) (*rquic.Conn, *quicgo.Stream, error) {
	c, s, err := p.stream(ctx, h)
	if err != nil {
		return nil, nil, err
	}
	if err := writeHeader(s, h); err != nil {
		flow.Reset(s, hop.CodeNextHop)
		return nil, nil, &Error{Reason: NextHop, Next: h.Route[0], Err: err}
	}
	return c, s, nil
}

// stream opens a QUIC stream to h.Route[0], on the link of h's class.
func (p *Peers) stream(ctx context.Context, h *hop.Header) (*rquic.Conn, *quicgo.Stream, error) {
	next := h.Route[0]
	set := p.o.Manifests()
	if set.Relay(next) == nil {
		return nil, nil, unknown(next)
	}
	link, err := p.link(set.Relay(next), class(h))
	if err != nil {
		return nil, nil, err
	}
	c, s, err := link.OpenStream(ctx)
	if err != nil {
		return nil, nil, &Error{Reason: NextHop, Next: next, Err: fmt.Errorf("open stream: %w", err)}
	}
	return c, s, nil
}

// OpenLive opens a stream to h.Route[0] only if its connection is up now: a
// link request, which a round sends another way rather than wait.
func (p *Peers) OpenLive(ctx context.Context, h *hop.Header) (*quicgo.Stream, error) {
	c := p.quic.Live(h.Route[0])
	if c == nil {
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: rquic.ErrPeerDown}
	}
	s, err := c.OpenFlow(ctx)
	if err != nil {
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: fmt.Errorf("open stream: %w", err)}
	}
	if err := writeHeader(s, h); err != nil {
		flow.Reset(s, hop.CodeNextHop)
		return nil, &Error{Reason: NextHop, Next: h.Route[0], Err: err}
	}
	return s, nil
}

// link is the QUIC link a new stream of class to peer takes. A peer with
// replicas (a sidecar relay) spreads new streams over its ready replicas
// in turn, preferring those connected now; a stream, and so a UDP or
// packet session, stays on the replica it opened on.
func (p *Peers) link(peer *v1alpha1.RelayNode, class string) (*rquic.Link, error) {
	if !peer.Spec.IsSidecar() {
		return p.quic.Link(peer.Name, class, peer.Spec.Endpoints), nil
	}
	addr, err := p.replica(peer)
	if err != nil {
		return nil, err
	}
	return p.quic.Replica(peer.Name, class, addr), nil
}

// replica picks the replica of a sidecar peer a new flow goes to: the next
// in turn that is connected and has not been seen lost, else the next.
func (p *Peers) replica(peer *v1alpha1.RelayNode) (string, error) {
	eps := peer.Spec.Endpoints
	if len(eps) == 0 {
		return "", &Error{Reason: NextHop, Next: peer.Name, Err: fmt.Errorf("sidecar relay %q has no ready replica", peer.Name)}
	}
	v, _ := p.spread.LoadOrStore(peer.Name, new(atomic.Uint64))
	turn := v.(*atomic.Uint64).Add(1)
	pick := eps[turn%uint64(len(eps))]
	for i := range eps {
		if a := eps[(turn+uint64(i))%uint64(len(eps))]; p.quic.ReplicaUp(peer.Name, a) {
			pick = a
			break
		}
	}
	return pick, nil
}

func unknown(next string) error {
	return &Error{Reason: NextHop, Next: next, Err: fmt.Errorf("%q is not a known relay", next)}
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

// Congestion is the TCP congestion control the TLS links run, and why.
type Congestion = tlslink.Congestion

// ChooseCongestion decides what the TLS links run for a RelayNode's
// spec.links.congestionControl (tlslink.ChooseCongestion).
func ChooseCongestion(want string) Congestion { return tlslink.ChooseCongestion(want) }
