package relay

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/admit"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/routectl"
)

// dispatcher serves what peers open, whatever the transport: it admits a
// hop whose header the link layer read (admit.Stream, against the
// manifests in force), takes a flow token, and hands it to the role it
// asks for. It is the link layer's one way up (nexthop.Upper), for what it
// learns of peers too.
type dispatcher struct {
	*env
	tcp     *tcpFlows
	udp     *udpFlows
	packets *packetTunnels
	measure *measurer
	ctl     *routectl.Controller // when the relay routes its chains
}

// Serve serves what a peer opened.
func (d *dispatcher) Serve(in nexthop.Inbound) {
	h, from := &in.Header, in.Hop
	over := admit.QUIC
	if from.Transport == v1alpha1.TransportTLS {
		over = admit.TLS
	}
	g, ref := admit.Stream(d.manifests(), d.name, from.Peer, h, over, time.Now())
	if ref != nil {
		d.rejected(from.Peer, from.Remote, ref.Reason, ref, h.Tunnel)
		from.Refuse(hop.CodeRejected)
		return
	}
	from.Admitted()
	switch h.Kind {
	case hop.KindLinks:
		d.measure.serveLinks(from, h, g.Chain)
		return
	case hop.KindTrace:
		d.measure.serveTrace(from.Stream(), h, g.Chain)
		return
	}
	var x *packetExit
	if h.Kind == hop.KindPacket && g.Last {
		var err error
		if x, err = d.packets.exitFor(h.Tunnel); err != nil {
			d.rejected(from.Peer, from.Remote, "no_device", err, h.Tunnel)
			from.Refuse(hop.CodeRejected)
			return
		}
	}
	if !d.acquire(h.Tunnel, netip.Addr{}) {
		from.Refuse(d.refusal())
		return
	}
	defer d.release(h.Tunnel, netip.Addr{})
	switch {
	case x != nil:
		d.packets.serve(from, x)
	case h.Kind == hop.KindTCP && g.Last:
		d.tcp.exit(from.Stream(), from.Peer, h, g.Tunnel)
	case h.Kind == hop.KindTCP:
		d.tcp.middle(from.Stream(), from.Peer, h, g.Tunnel, g.Chain)
	case h.Kind == hop.KindEcho && g.Last:
		d.udp.echoExit(from, h, g.Tunnel)
	case g.Last:
		d.udp.exit(from, h, g.Tunnel)
	case from.Transport == v1alpha1.TransportTLS:
		// A session framed on a byte stream goes on as one, over TLS.
		d.tcp.middle(from.Stream(), from.Peer, h, g.Tunnel, g.Chain)
	default: // a UDP or packet session over QUIC: datagrams and frames
		d.udp.middle(from, h, g.Tunnel)
	}
}

// Event takes what the link layer learned of a peer: the answers to link
// probes, a peer that drains (new flows route around it, and a route
// controller looks again at once), a handshake refused (a problem the
// operator hears of), a hop refused before its header was read.
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
	case nexthop.Refused:
		d.rejected(e.Peer, e.Remote, e.Reason, e.Err, "")
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
