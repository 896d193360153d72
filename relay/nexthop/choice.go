package nexthop

import (
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
)

// Choice is the transport a hop took and why. Under transport: auto it
// meters the flow and, when the flow ends, feeds its shape and goodput
// back to the choices of the next flows.
type Choice struct {
	Transport v1alpha1.Transport
	Reason    string

	p            *Peers
	peer, tunnel string
	meter        *flow.Meter // nil unless auto
	out          flow.End
	// spareOnly: TLS for a flow of a Tunnel not known to be bulk, only on
	// a connection ready now.
	spareOnly bool
}

// Count returns c, the counter of direction dir (flow.Up or flow.Down),
// counting into the choice's meter too under auto.
func (ch *Choice) Count(c flow.Counter, dir int32) flow.Counter {
	if ch == nil || ch.meter == nil {
		return c
	}
	return ch.meter.Count(c, dir)
}

// Done feeds the finished flow back.
func (ch *Choice) Done() {
	if ch == nil || ch.meter == nil {
		return
	}
	if t, ok := ch.out.(*flow.TLSEnd); ok {
		sent, retransmitted := t.Segments()
		ch.p.auto.tcpLoss(ch.peer, sent, retransmitted)
	}
	ch.p.auto.done(ch.peer, ch.tunnel, ch.Transport, ch.meter.Bytes(), ch.meter.Turns(), ch.meter.Active(), time.Now())
	// After done: what the flow said is never out of sight meanwhile.
	ch.p.auto.unwatch(ch.tunnel, ch.meter)
}

// choose settles the transport of a new hop for h.
func (p *Peers) choose(h *hop.Header, transport v1alpha1.Transport) *Choice {
	ch := &Choice{Transport: transport, Reason: ReasonExplicit, p: p, peer: h.Route[0], tunnel: h.Tunnel}
	if transport != v1alpha1.TransportAuto {
		return ch
	}
	switch h.Kind {
	case hop.KindTCP:
		var bulk bool
		ch.meter = flow.NewMeter()
		ch.Transport, ch.Reason, bulk = p.pick(ch.peer, h.Tunnel, true, ch.meter)
		ch.spareOnly = !bulk
	case hop.KindPacket:
		ch.Transport, ch.Reason, _ = p.pick(ch.peer, h.Tunnel, false, nil)
	default:
		// Traces measure what a new short flow would see.
		ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonShort
	}
	return ch
}

// PacketTransport is the transport a packet session of a chain with
// transport takes to peer.
func (p *Peers) PacketTransport(h *hop.Header, transport v1alpha1.Transport) v1alpha1.Transport {
	return p.choose(h, transport).Transport
}

func (p *Peers) pick(peer, tunnel string, isFlow bool, m progress) (v1alpha1.Transport, string, bool) {
	// The loss counts walk every connection to the peer: only packet
	// sessions and flows of Tunnels of unknown shape ask for them, so a
	// known Tunnel's flow does not pay it.
	return p.auto.pick(peer, tunnel, isFlow, m, peerLoss{p, peer}, time.Now())
}

// peerLoss is a linkLoss of the relay's link to peer.
type peerLoss struct {
	p    *Peers
	peer string
}

func (l peerLoss) QUIC() (sent, lost uint64) { return l.p.quic.Loss(l.peer) }

func (l peerLoss) OpenTLS() (sent, retransmitted uint64) { return l.p.live.counts(l.peer) }

func (l peerLoss) RTT() time.Duration {
	if c := l.p.quic.Live(l.peer); c != nil {
		return c.ConnectionStats().MinRTT
	}
	return 0
}

// LinkTransport is the transport bulk flows of auto chains take to peer
// now and why; "" before this relay chose one.
func (p *Peers) LinkTransport(peer string) (v1alpha1.Transport, string) {
	return p.auto.current(peer)
}

func (p *Peers) transportChanged(peer string, from, to v1alpha1.Transport, reason string, rates map[v1alpha1.Transport]float64) {
	if m := p.o.Metrics; m != nil {
		m.LinkTransport.DeletePartialMatch(map[string]string{"from": p.o.Name, "to": peer})
		m.LinkTransport.WithLabelValues(p.o.Name, peer, string(to), reason).Set(1)
	}
	if p.o.Log != nil {
		p.o.Log.Info("link transport chosen", "peer", peer, "from", string(from), "to", string(to), "reason", reason,
			"quic_mbps", int(rates[v1alpha1.TransportQUIC]/1e6), "tls_mbps", int(rates[v1alpha1.TransportTLS]/1e6))
	}
}
