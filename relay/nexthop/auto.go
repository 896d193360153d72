package nexthop

import (
	"sync"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// transport: auto. Each relay chooses per link (to the next relay) and per
// flow, from what it sees:
//   - the shape of a Tunnel's flows here: a Tunnel whose recent flows were
//     short rides QUIC, which opens a flow in one packet on a warm
//     connection, where a TLS flow costs a handshake to refill its pool;
//     so does one whose flows are interactive (requests and answers, the
//     direction turning at least once per interactiveBytes), whose time
//     goes in round trips and in recovering a lost packet with nothing
//     behind it, which QUIC does in a few round trips and TCP after a
//     probe timeout of 200 ms or more;
//   - the goodput bulk flows achieved on the link with each transport. Bulk
//     flows (and flows of unknown shape) take the faster one; one in
//     sampleEvery re-measures the other when its figure is stale, and the
//     choice changes only when the other is faster by switchMargin;
//   - before any measurement, bulk flows take TLS: the kernel's TCP with
//     its offloads moves bulk faster, and on lossy links too its
//     congestion control keeps far more of the link than quic-go's
//     (hack/bench/lossbench: at 1% loss 1.3 Gbit/s against 0.1);
//   - packet sessions of a packet-mode tun Tunnel take QUIC on a lossy link
//     (the link's loss as QUIC's packet counts and finished TLS flows'
//     TCP_INFO show it), where TCP inside TLS would retransmit twice.
const (
	// bulkBytes is the size from which a flow's goodput is a sample.
	bulkBytes = 1 << 20
	// shortBytes: a Tunnel whose flows average less is short, once
	// shortFlows of them ended.
	shortBytes = 256 << 10
	shortFlows = 4
	// interactiveBytes: a Tunnel whose flows move less than this between
	// turns of direction, on average, is interactive.
	interactiveBytes = 64 << 10
	// sampleEvery is how often a bulk flow re-measures the other
	// transport when its figure is older than staleAfter or has fewer than
	// minSamples samples.
	sampleEvery = 8
	staleAfter  = time.Minute
	minSamples  = 2
	// switchMargin: the other transport must be this much faster.
	switchMargin = 1.2
	// lossyLink is the QUIC loss ratio from which a link counts as lossy
	// before bulk flows measured it, over at least lossPackets packets.
	lossyLink   = 0.01
	lossPackets = 200
	// maxShapes bounds the Tunnels remembered (they come from manifests,
	// but a relay may see many over its life).
	maxShapes = 4096
)

// Reasons of a choice, the reason label of hoplink_link_transport_info.
const (
	ReasonShort       = "short_flows"
	ReasonInteractive = "interactive"
	ReasonUnmeasured  = "unmeasured"
	ReasonLossy       = "lossy_link"
	ReasonMeasured    = "measured"
	ReasonSampling    = "sampling"
	ReasonExplicit    = "explicit"
	// ReasonNoSpare: a flow of a Tunnel not known to be bulk found no TLS
	// connection ready and took QUIC rather than wait for a handshake.
	ReasonNoSpare = "no_spare"
	// ReasonTLSShare: the Tunnel's flows already hold their share of TLS
	// connections to the peer (maxTLSFlowsPerTunnel); the flow rides QUIC.
	ReasonTLSShare = "tls_share"
)

// maxTLSFlowsPerTunnel bounds a Tunnel's flows over TLS to one peer at a
// time under auto. Each TLS flow is a TCP connection of its own, whose
// kernel buffers the kernel grows and keeps full when the flow's reader
// stalls (1-2 MiB each here): a thousand stalled downloads of one Tunnel
// took the host to net.ipv4.tcp_mem, and every socket of every Tunnel
// stalled with them. Flows past the share ride the Tunnel's QUIC
// connection, whose flow-control window bounds them all together; 16
// connections are more than one Tunnel's bulk needs to fill a link.
const maxTLSFlowsPerTunnel = 16

// goodput is a moving average of bulk flows' goodput on one transport.
type goodput struct {
	bps float64 // bits per second
	n   int
	at  time.Time
}

func (g *goodput) add(bps float64, now time.Time) {
	if g.n == 0 {
		g.bps = bps
	} else {
		g.bps += (bps - g.bps) / 4
	}
	g.n++
	g.at = now
}

func (g *goodput) fresh(now time.Time) bool {
	return g.n >= minSamples && now.Sub(g.at) < staleAfter
}

// linkChoice is one link's state.
type linkChoice struct {
	bulk   v1alpha1.Transport // "" until first chosen
	reason string
	rate   map[v1alpha1.Transport]*goodput
	turn   uint64
	// TCP segments the link's finished TLS flows sent and retransmitted,
	// halved now and then so that they say what the link does lately.
	tcpSent, tcpLost uint64
}

// shape is what a Tunnel's flows carried here.
type shape struct {
	avg     float64 // bytes per flow, moving average
	perTurn float64 // bytes between turns of direction, moving average
	n       int
}

// chooser holds the choices of every link of a relay.
type chooser struct {
	mu     sync.Mutex
	links  map[string]*linkChoice
	shapes map[string]*shape
	// udpBulkAt: when a UDP session of a Tunnel last sent at a bulk rate.
	udpBulkAt map[string]time.Time
	// changed is told when a link's bulk transport changes (metrics, log).
	changed func(peer string, from, to v1alpha1.Transport, reason string, rates map[v1alpha1.Transport]float64)
	// goodput is told each new average.
	goodput func(peer string, t v1alpha1.Transport, bps float64)
}

func newChooser() *chooser {
	return &chooser{links: map[string]*linkChoice{}, shapes: map[string]*shape{}}
}

func other(t v1alpha1.Transport) v1alpha1.Transport {
	if t == v1alpha1.TransportTLS {
		return v1alpha1.TransportQUIC
	}
	return v1alpha1.TransportTLS
}

func (c *chooser) link(peer string) *linkChoice {
	l := c.links[peer]
	if l == nil {
		l = &linkChoice{rate: map[v1alpha1.Transport]*goodput{
			v1alpha1.TransportQUIC: {}, v1alpha1.TransportTLS: {},
		}}
		c.links[peer] = l
	}
	return l
}

// pick chooses the transport of a new flow of tunnel to peer. quicSent and
// quicLost are the packets the QUIC connections to peer sent and lost;
// only packet sessions look at them.
// Packet sessions pass isFlow false: they are bulk, and short flows do not
// apply. bulk says the Tunnel's flows are known to be bulk (worth a
// handshake).
func (c *chooser) pick(peer, tunnel string, isFlow bool, quicSent, quicLost uint64, now time.Time) (t v1alpha1.Transport, reason string, bulk bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.shapes[tunnel]
	known := s != nil && s.n >= shortFlows
	if isFlow && known && s.avg < shortBytes {
		return v1alpha1.TransportQUIC, ReasonShort, false
	}
	if isFlow && known && s.perTurn < interactiveBytes {
		return v1alpha1.TransportQUIC, ReasonInteractive, false
	}
	bulk = !isFlow || known
	l := c.link(peer)
	c.decide(peer, l, now)
	if !isFlow && l.reason != ReasonMeasured && lossy(quicSent+l.tcpSent, quicLost+l.tcpLost) {
		// Packets of TCP flows inside a TLS connection would be
		// retransmitted twice, each layer stalling the other.
		return v1alpha1.TransportQUIC, ReasonLossy, bulk
	}
	if isFlow {
		l.turn++
		if o := other(l.bulk); l.turn%sampleEvery == 0 && !l.rate[o].fresh(now) {
			return o, ReasonSampling, bulk
		}
	}
	return l.bulk, l.reason, bulk
}

// lossy says whether lost of sent packets make a link lossy.
func lossy(sent, lost uint64) bool {
	return sent >= lossPackets && float64(lost) >= lossyLink*float64(sent)
}

// decide settles a link's bulk transport from what is known now.
func (c *chooser) decide(peer string, l *linkChoice, now time.Time) {
	q, t := l.rate[v1alpha1.TransportQUIC], l.rate[v1alpha1.TransportTLS]
	to, reason := l.bulk, l.reason
	switch {
	case q.n >= minSamples && t.n >= minSamples:
		cur := l.bulk
		if cur == "" || l.reason != ReasonMeasured {
			// The first verdict of measurement: the faster one.
			to = v1alpha1.TransportTLS
			if q.bps > t.bps {
				to = v1alpha1.TransportQUIC
			}
		} else if o := other(cur); l.rate[o].bps > l.rate[cur].bps*switchMargin {
			to = o
		}
		reason = ReasonMeasured
	case l.reason == ReasonMeasured:
		// Keep a measured verdict while samples are renewed.
	default:
		to, reason = v1alpha1.TransportTLS, ReasonUnmeasured
	}
	if to != l.bulk || reason != l.reason {
		from := l.bulk
		l.bulk, l.reason = to, reason
		if c.changed != nil {
			c.changed(peer, from, to, reason, map[v1alpha1.Transport]float64{
				v1alpha1.TransportQUIC: q.bps, v1alpha1.TransportTLS: t.bps})
		}
	}
}

// done feeds back a finished flow: its Tunnel's shape, and its goodput
// when it was bulk.
func (c *chooser) done(peer, tunnel string, t v1alpha1.Transport, bytes, turns int64, active time.Duration, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	perTurn := float64(bytes) / float64(turns+1)
	s := c.shapes[tunnel]
	if s == nil {
		if len(c.shapes) >= maxShapes {
			clear(c.shapes)
		}
		s = &shape{avg: float64(bytes), perTurn: perTurn}
		c.shapes[tunnel] = s
	} else {
		s.avg += (float64(bytes) - s.avg) / 8
		s.perTurn += (perTurn - s.perTurn) / 8
	}
	s.n++
	// An interactive flow's goodput says how often it turned, not how fast
	// the transport is.
	if bytes < bulkBytes || active <= 0 || perTurn < interactiveBytes {
		return
	}
	g := c.link(peer).rate[t]
	g.add(float64(bytes)*8/active.Seconds(), now)
	if c.goodput != nil {
		c.goodput(peer, t, g.bps)
	}
}

// tcpLoss feeds back what a finished TLS flow's connection sent and
// retransmitted.
func (c *chooser) tcpLoss(peer string, sent, retransmitted uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.link(peer)
	l.tcpSent += uint64(sent)
	l.tcpLost += uint64(retransmitted)
	if l.tcpSent > 1<<20 {
		l.tcpSent, l.tcpLost = l.tcpSent/2, l.tcpLost/2
	}
}

// forget drops the links to peers no longer known.
func (c *chooser) forget(keep func(peer string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.links {
		if !keep(p) {
			delete(c.links, p)
		}
	}
}

// current is a link's bulk transport and its reason, "" before any flow.
func (c *chooser) current(peer string) (v1alpha1.Transport, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.links[peer]; l != nil {
		return l.bulk, l.reason
	}
	return "", ""
}
