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

	hs   *Hops
	peer string
	// shape is what auto learns this flow's shape under (shapeKey).
	shape string
	meter *flow.Meter // nil unless auto
	out   flow.End
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

// Unmeasured keeps the flow out of what auto learns of the link: a flow
// held to its Tunnel's rate (spec.limits.rateMbps) shows that rate, not
// what the link carries for every other Tunnel on it.
func (ch *Choice) Unmeasured() {
	if ch == nil || ch.meter == nil {
		return
	}
	ch.hs.auto.unwatch(ch.shape, ch.meter)
	ch.meter = nil
}

// Done feeds the finished flow back.
func (ch *Choice) Done() {
	if ch == nil || ch.meter == nil {
		return
	}
	if t, ok := ch.out.(*flow.TLSEnd); ok {
		sent, retransmitted := t.Segments()
		ch.hs.auto.tcpLoss(ch.peer, sent, retransmitted)
	}
	ch.hs.auto.done(ch.peer, ch.shape, ch.Transport, ch.meter.Bytes(), ch.meter.Turns(), ch.meter.Active(), time.Now())
	// After done: what the flow said is never out of sight meanwhile.
	ch.hs.auto.unwatch(ch.shape, ch.meter)
}

// choose settles the transport of a new hop for h.
func (hs *Hops) choose(h *hop.Header, transport v1alpha1.Transport) *Choice {
	ch := &Choice{Transport: transport, Reason: ReasonExplicit, hs: hs, peer: h.Route[0], shape: shapeKey(h)}
	if transport != v1alpha1.TransportAuto {
		return ch
	}
	switch h.Kind {
	case hop.KindTCP:
		var bulk bool
		ch.meter = flow.NewMeter()
		ch.Transport, ch.Reason, bulk = hs.pick(ch.peer, ch.shape, true, ch.meter)
		ch.spareOnly = !bulk
	case hop.KindPacket:
		ch.Transport, ch.Reason, _ = hs.pick(ch.peer, h.Tunnel, false, nil)
	default:
		// Traces measure what a new short flow would see.
		ch.Transport, ch.Reason = v1alpha1.TransportQUIC, ReasonShort
	}
	return ch
}

// shapeKey is what a TCP flow's shape is learned under: its Tunnel and
// its target. A TCP Tunnel has one target, so this is the Tunnel; a
// flow-mode tun Tunnel's flows go to every service behind its routes, a
// site's shell sessions and its backups alike, and one shape for all would
// send a bulk flow over QUIC because the Tunnel's last flows were echoes
// (hack/bench/wan -paths tunchain: 3.5 Mbit/s where TLS carried 78).
func shapeKey(h *hop.Header) string {
	if h.Target == "" {
		return h.Tunnel
	}
	return h.Tunnel + " " + h.Target
}

func (hs *Hops) pick(peer, tunnel string, isFlow bool, m progress) (v1alpha1.Transport, string, bool) {
	// The loss counts walk every connection to the peer: only packet
	// sessions and flows of Tunnels of unknown shape ask for them, and
	// long-lived interactive flows once in cleanFor per link, so most
	// known Tunnels' flows do not pay it.
	return hs.auto.pick(peer, tunnel, isFlow, m, peerLoss{hs, peer}, time.Now())
}

// peerLoss is a linkLoss of the relay's link to peer.
type peerLoss struct {
	hs   *Hops
	peer string
}

func (l peerLoss) QUIC() (sent, lost uint64) { return l.hs.p.links.Loss(l.peer) }

func (l peerLoss) OpenTLS() (sent, retransmitted uint64) { return l.hs.live.counts(l.peer) }

func (l peerLoss) RTT() time.Duration {
	if c := l.hs.p.links.Live(l.peer); c != nil {
		return c.ConnectionStats().MinRTT
	}
	return 0
}

func (hs *Hops) transportChanged(peer string, from, to v1alpha1.Transport, reason string, rates map[v1alpha1.Transport]float64) {
	if m := hs.m; m != nil {
		m.LinkTransport.DeletePartialMatch(map[string]string{"from": hs.name, "to": peer})
		m.LinkTransport.WithLabelValues(hs.name, peer, string(to), reason).Set(1)
	}
	if hs.log != nil {
		hs.log.Info("link transport chosen", "peer", peer, "from", string(from), "to", string(to), "reason", reason,
			"quic_mbps", int(rates[v1alpha1.TransportQUIC]/1e6), "tls_mbps", int(rates[v1alpha1.TransportTLS]/1e6))
	}
}
