package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/relay/admit"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/routectl"
)

// headerTimeout bounds how long a peer may take to send a stream's header.
const headerTimeout = 10 * time.Second

// maxPendingHeaders bounds the streams one connection may have waiting for
// their header: a stream holds no flow token until its header is read, so a
// peer sending half headers would otherwise hold a goroutine and buffers per
// stream for headerTimeout, without bound. It is a connection's, not a
// peer's: a peer's connections are its Tunnels' links, and one of them full
// of half headers must not refuse the streams of the others. The
// connections a peer may hold are bounded too (quic.Options.MaxConns).
const maxPendingHeaders = 256

// dispatcher serves what peers open: it reads a stream's header (bounded
// in size and time), admits it (admit.Stream, against the manifests in
// force), takes a flow token, and hands it to the role it asks for. It is
// the link layer's one way up (nexthop.Upper), for what it learns of peers
// too.
type dispatcher struct {
	*env
	tcp     *tcpFlows
	udp     *udpFlows
	packets *packetTunnels
	measure *measurer
	ctl     *routectl.Controller // when the relay routes its chains

	mu      sync.Mutex
	pending map[*rquic.Conn]int // streams waiting for their header, by connection
}

// awaitHeader takes a slot for a stream of c to wait for its header in.
func (d *dispatcher) awaitHeader(c *rquic.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[c] >= maxPendingHeaders {
		return false
	}
	if d.pending == nil {
		d.pending = map[*rquic.Conn]int{}
	}
	d.pending[c]++
	return true
}

func (d *dispatcher) headerRead(c *rquic.Conn) {
	d.mu.Lock()
	if d.pending[c]--; d.pending[c] <= 0 {
		delete(d.pending, c)
	}
	d.mu.Unlock()
}

// Serve serves what a peer opened, over either transport.
func (d *dispatcher) Serve(in nexthop.Inbound) {
	if in.TLS != nil {
		d.serveTLS(in)
		return
	}
	d.serveQUIC(in.Conn, in.Stream)
}

// Event takes what the link layer learned of a peer: the answers to link
// probes, a peer that drains (new flows route around it, and a route
// controller looks again at once), a handshake refused (a problem the
// operator hears of).
func (d *dispatcher) Event(e nexthop.Event) {
	switch e.Kind {
	case nexthop.ProbeEcho:
		d.measure.links.Echo(e.Peer, e.Payload)
	case nexthop.PeerDraining:
		d.measure.links.Stale(e.Peer)
		if d.ctl != nil {
			d.ctl.Kick()
		}
	case nexthop.Rejected:
		d.problems.add(adminapi.ProblemHandshake, "", fmt.Sprintf("from %v: %v", e.Remote, e.Err))
	}
}

// serveQUIC serves a stream a peer opened on its QUIC connection.
func (d *dispatcher) serveQUIC(c *rquic.Conn, s *quicgo.Stream) {
	if !d.awaitHeader(c) {
		d.rejected(c.Peer, c.RemoteAddr(), "header_limit", errors.New("too many streams waiting for their header"), "")
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := hop.Read(s)
	d.headerRead(c)
	if _, _, reset := flow.ResetCode(err); reset {
		// The flow ended before its header arrived (a client that gave up
		// at once): nothing hostile, nothing to count.
		flow.Reset(s, hop.CodeReset)
		return
	}
	if err != nil {
		d.rejected(c.Peer, c.RemoteAddr(), "bad_header", err, "")
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Time{})
	g, ref := admit.Stream(d.manifests(), d.name, c.Peer, &h, admit.QUIC, time.Now())
	if ref != nil {
		d.rejected(c.Peer, c.RemoteAddr(), ref.Reason, ref, h.Tunnel)
		flow.Reset(s, hop.CodeRejected)
		return
	}
	c.Admitted() // the peer's link now: its drain news counts
	switch h.Kind {
	case hop.KindLinks:
		d.measure.serveLinks(c.Peer, c.RemoteAddr(), s, &h, g.Chain)
		return
	case hop.KindTrace:
		d.measure.serveTrace(flow.Stream(s), &h, g.Chain)
		return
	}
	var x *packetExit
	if h.Kind == hop.KindPacket && g.Last {
		if x, err = d.packets.exitFor(h.Tunnel); err != nil {
			d.rejected(c.Peer, c.RemoteAddr(), "no_device", err, h.Tunnel)
			flow.Reset(s, hop.CodeRejected)
			return
		}
	}
	if !d.acquire(h.Tunnel, netip.Addr{}) {
		flow.Reset(s, d.refusal())
		return
	}
	defer d.release(h.Tunnel, netip.Addr{})
	switch {
	case x != nil:
		d.packets.serveQUIC(c, s, x)
	case h.Kind == hop.KindTCP && g.Last:
		defer c.Hold()()
		d.tcp.exit(flow.HeldStream(c.Conn, s, nil), &h, g.Tunnel)
	case h.Kind == hop.KindTCP:
		defer c.Hold()()
		d.tcp.middle(flow.HeldStream(c.Conn, s, nil), &h, g.Tunnel, g.Chain)
	case g.Last:
		d.udp.exit(c, s, &h, g.Tunnel)
	default: // a UDP or packet session: datagrams and frames
		d.udp.middle(c, s, &h)
	}
}

// refusal is the code a flow refused its token is reset with: shutdown
// while the relay drains (the peer learns the relay takes no new flows),
// else rejected (a limit).
func (d *dispatcher) refusal() hop.Code {
	if d.draining.Load() {
		return hop.CodeShutdown
	}
	return hop.CodeRejected
}

// serveTLS serves a flow a peer sent over a TLS connection: the same
// header, the same checks; TCP flows, traces, packet and UDP sessions.
func (d *dispatcher) serveTLS(from nexthop.Inbound) {
	peer, c := from.Peer, from.TLS
	in := flow.TLS(c, from.Done)
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		in.Abort() // a spare the peer retired unused, or a peer gone
		return
	}
	h, err := hop.Read(io.MultiReader(bytes.NewReader(first[:]), c))
	if err != nil {
		d.rejected(peer, c.RemoteAddr(), "bad_header", err, "")
		in.Abort()
		return
	}
	from.Started()
	c.SetReadDeadline(time.Time{})
	g, ref := admit.Stream(d.manifests(), d.name, peer, &h, admit.TLS, time.Now())
	if ref != nil {
		d.rejected(peer, c.RemoteAddr(), ref.Reason, ref, h.Tunnel)
		in.Abort()
		return
	}
	if h.Kind == hop.KindTrace {
		d.measure.serveTrace(in, &h, g.Chain)
		return
	}
	if !d.acquire(h.Tunnel, netip.Addr{}) {
		in.Abort()
		return
	}
	defer d.release(h.Tunnel, netip.Addr{})
	switch {
	case h.Kind == hop.KindPacket && g.Last:
		x, err := d.packets.exitFor(h.Tunnel)
		if err != nil {
			d.rejected(peer, c.RemoteAddr(), "no_device", err, h.Tunnel)
			in.Abort()
			return
		}
		d.packets.serveTLS(in, x)
	case h.Kind == hop.KindUDP && g.Last:
		d.udp.exitTLS(in, &h, g.Tunnel)
	case g.Last:
		d.tcp.exit(in, &h, g.Tunnel)
	default:
		d.tcp.middle(in, &h, g.Tunnel, g.Chain)
	}
}
