package nexthop

import (
	"context"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
)

// UDP sessions under transport: auto. A session rides QUIC datagrams
// unless its Tunnel is bulk: one whose udp.mode is stream, or whose
// sessions passed rquic.AutoFramesRate in the last udpBulkFor. A bulk
// session frames its datagrams on a reliable byte stream whichever the
// transport, so it takes the link's bulk transport as a bulk TCP flow does:
// the one bulk flows measured faster, TLS before they did. Over TLS that
// stream costs a quarter of QUIC's CPU per byte (hack/bench/cores.sh), and
// on a lossy link the kernel's TCP keeps far more of it than quic-go
// (hack/bench/lossbench). Each such session is a TCP connection, so it
// counts in its Tunnel's maxTLSFlowsPerTunnel.
const udpBulkFor = 10 * time.Minute

// ReasonDatagrams: a UDP session of a Tunnel not known to be bulk rides
// QUIC datagrams.
const ReasonDatagrams = "datagrams"

// openUDP opens a hop to h.Route[0] for a new UDP session of a Tunnel
// with mode, on a chain with transport, and sends it h.
func (hs *Hops) openUDP(ctx context.Context, h *hop.Header, transport v1alpha1.Transport, mode v1alpha1.UDPMode) (*Hop, error) {
	peer := h.Route[0]
	t, reason := hs.udpTransport(h, transport, mode)
	if t == v1alpha1.TransportTLS {
		out, shared, err := hs.openTLSShared(ctx, h, false, false)
		if err != nil {
			return nil, err
		}
		if shared {
			hs.countFlow(peer, t, reason)
			return out, nil
		}
		t, reason = v1alpha1.TransportQUIC, ReasonTLSShare
	}
	out, err := hs.openSession(ctx, h)
	if err != nil {
		return nil, err
	}
	hs.countFlow(peer, t, reason)
	return out, nil
}

func (hs *Hops) udpTransport(h *hop.Header, transport v1alpha1.Transport, mode v1alpha1.UDPMode) (v1alpha1.Transport, string) {
	switch {
	case transport != v1alpha1.TransportAuto || mode == v1alpha1.UDPDatagram:
		// The chain's quic and tls name the transport of TCP flows;
		// UDP Tunnels of such chains keep QUIC, as documented.
		return v1alpha1.TransportQUIC, ReasonExplicit
	case mode != v1alpha1.UDPStream && !hs.auto.udpBulk(h.Tunnel, time.Now()):
		return v1alpha1.TransportQUIC, ReasonDatagrams
	}
	return hs.auto.bulkTransport(h.Route[0], time.Now())
}

// UDPBulk records that a session of tunnel sends at a bulk rate: the
// Tunnel's next sessions take the link's bulk transport.
func (hs *Hops) UDPBulk(tunnel string) { hs.auto.sawUDPBulk(tunnel, time.Now()) }

func (hs *Hops) countFlow(peer string, t v1alpha1.Transport, reason string) {
	if m := hs.m; m != nil {
		m.LinkFlows.WithLabelValues(hs.name, peer, string(t), reason).Inc()
	}
}

// bulkTransport is the transport bulk flows of the link take now.
func (c *chooser) bulkTransport(peer string, now time.Time) (v1alpha1.Transport, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.link(peer)
	c.decide(peer, l, now)
	return l.bulk, l.reason
}

func (c *chooser) sawUDPBulk(tunnel string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.udpBulkAt == nil {
		c.udpBulkAt = map[string]time.Time{}
	}
	if _, ok := c.udpBulkAt[tunnel]; !ok && len(c.udpBulkAt) >= maxShapes {
		clear(c.udpBulkAt)
	}
	c.udpBulkAt[tunnel] = now
}

func (c *chooser) udpBulk(tunnel string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.udpBulkAt[tunnel]
	return ok && now.Sub(at) < udpBulkFor
}
