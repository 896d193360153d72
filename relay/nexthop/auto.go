package nexthop

import (
	"math"
	"sync"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// transport: auto. Each relay chooses per link (to the next relay) and per
// flow, from what it sees:
//   - the shape of a Tunnel's flows here (per target, which sets a tun
//     Tunnel's services apart: shapeKey): a Tunnel whose recent flows were
//     short rides QUIC, which opens a flow in one packet on a warm
//     connection, where a TLS flow costs a handshake to refill its pool;
//     so does one whose flows are interactive (requests and answers, the
//     direction turning at least once per interactiveBytes), whose time
//     goes in round trips and in recovering a lost packet with nothing
//     behind it, which QUIC does in a few round trips and TCP after a
//     probe timeout of 200 ms or more;
//   - but a Tunnel whose flows live long in requests and answers (longTurns
//     turns of direction each, on average: a database session, a client's
//     kept-alive connection) rides TLS on a short link that shows no loss:
//     its handshake is paid once for many exchanges, and each exchange
//     costs less over TCP, which the kernel carries (hack/bench/rr.sh: 1.1
//     ms added at the median through a hop over TLS, 1.7 over QUIC). On a
//     long link or one that loses packets it keeps QUIC, whose recovery of
//     a lone lost packet costs round trips, not a retransmission timeout.
//     Such flows have their own share of TLS connections to a peer
//     (maxTLSInteractivePerTunnel), with bounded socket buffers, and take
//     a spare or a handshake that can start at once: in a burst of new
//     clients the rest ride QUIC (no_spare) rather than queue behind
//     handshakes;
//   - the goodput bulk flows achieved on the link with each transport. Bulk
//     flows (and flows of unknown shape) take the faster one; one in
//     sampleEvery re-measures the other when its figure is stale, and the
//     choice changes only when the other is faster by switchMargin;
//   - before any measurement, bulk flows take TLS: the kernel's TCP with
//     its offloads moves bulk faster, and on lossy links too its
//     congestion control keeps far more of the link than quic-go's
//     (hack/bench/lossbench: at 1% loss 1.3 Gbit/s against 0.1);
//   - a flow of a Tunnel whose shape is not known yet rides QUIC on a link
//     that loses packets. Its shape is a guess either way, and the two
//     wrong guesses do not cost alike: a request/response flow over TCP
//     waits a retransmission timeout (200 ms or more) for each lost lone
//     packet, for as long as it lives, however many Tunnels came before;
//     a bulk flow over QUIC is slower, but shows what it is: one finished
//     flow that moved bulkBytes, not in requests and answers, says the
//     Tunnel is bulk, and its next flows take the bulk transport; so does
//     one still open that has, for the Tunnel's flows opened meanwhile.
//     So only a bulk Tunnel's first flows pay for the guess, where every
//     request/response Tunnel's first flows paid for the other one. A
//     clean link keeps the guess it had: TLS. What the link lost is in
//     QUIC's packet counts and the TLS flows' TCP_INFO, the open ones'
//     too, since a link's only flows may be long or end late;
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
	// losesLost lost packets, losesRatio of those sent at least, make a
	// link one that loses packets for flows of unknown shape: QUIC's own
	// bar for sending lone packets twice (relay/quic/redundant.go). Any
	// loss costs a request/response flow over TCP a retransmission
	// timeout, so the bar is low (three links that lose 1% end to end
	// lose 0.33% each); two losses, so that a stray one does not count.
	losesLost  = 2
	losesRatio = 0.001
	// maxShapes bounds the Tunnels (and tun Tunnels' targets) remembered:
	// they come from manifests and from what clients dial, and a relay may
	// see many over its life. Past it they are all learned anew.
	maxShapes = 4096
	// guessRate is the rate, in bit/s, a link is taken to carry for bulk
	// before TLS flows measured what it carries: what a bulk flow of
	// unknown shape would lose over QUIC is weighed against it.
	guessRate = 100e6
	// tcpMinRTO is Linux's floor of TCP's retransmission timeout, which a
	// lone lost packet waits on top of two round trips (tail loss probe).
	tcpMinRTO = 200 * time.Millisecond
	// watchFlows bounds the open flows of a Tunnel watched for a bulk
	// one; the newest are kept.
	watchFlows = 16
	// longTurns: a Tunnel whose flows turn direction this often on
	// average, 16 requests and answers, is long-lived interactive, worth a
	// handshake each on a link no longer than shortLinkRTT.
	longTurns    = 32
	shortLinkRTT = 20 * time.Millisecond
)

// Reasons of a choice, the reason label of hoplink_link_transport_info.
const (
	ReasonShort       = "short_flows"
	ReasonInteractive = "interactive"
	// ReasonLongInteractive: a flow of a Tunnel whose flows are long-lived
	// interactive, on a short link that shows no loss, rides TLS.
	ReasonLongInteractive = "long_interactive"
	ReasonUnmeasured      = "unmeasured"
	ReasonLossy           = "lossy_link"
	// ReasonLossBound: a flow of unknown shape on a link that loses
	// packets takes the bulk transport, since QUIC's loss-based congestion
	// control would cost a bulk flow there more than TCP's timeouts would
	// cost requests (quicBinds).
	ReasonLossBound = "quic_loss_bound"
	ReasonMeasured  = "measured"
	ReasonSampling  = "sampling"
	ReasonExplicit  = "explicit"
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

// maxTLSInteractivePerTunnel bounds a Tunnel's long-lived interactive
// flows over TLS to one peer (ReasonLongInteractive), a share of their own:
// a Tunnel of many clients (an application's connection pools) holds one
// connection each; maxTLSInteractive bounds them at this relay, all
// Tunnels and peers together. Their sockets at this relay keep
// interactiveBuffer each way (the kernel doubles it: 128 KiB), instead of
// growing with the kernel's autotuning. That bounds what the connection
// holds in flight both ways (what this end sends, what it lets the peer
// send): a Tunnel's full share of stalled flows holds at most 128 MiB
// here, all of them 256 MiB, as 16 bulk flows of each of 8 Tunnels may
// with their buffers grown. A flow that turns bulk is held to its window,
// about 64 KiB per round trip: 25 Mbit/s on the longest link such flows
// take (shortLinkRTT), 500 Mbit/s at 1 ms.
const (
	maxTLSInteractivePerTunnel = 512
	maxTLSInteractive          = 1024
	interactiveBuffer          = 64 << 10
	// cleanFor is how long a link's verdict of short and clean is kept:
	// asking walks its open TLS flows.
	cleanFor = 250 * time.Millisecond
)

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
	// clean: the link was short and showed no loss at cleanAt.
	clean   bool
	cleanAt time.Time
}

// shape is what a Tunnel's flows carried here.
type shape struct {
	avg     float64 // bytes per flow, moving average
	perTurn float64 // bytes between turns of direction, moving average
	turns   float64 // turns of direction per flow, moving average
	n       int
	// lastBulk: the last flow that ended was bulk (a goodput sample).
	lastBulk bool
}

// progress is what an open flow moved so far (its flow.Meter).
type progress interface {
	Bytes() int64
	Turns() int64
}

// bulkSoFar says whether an open flow already shows it is bulk: bulkBytes
// moved, and not in requests and answers.
func bulkSoFar(p progress) bool {
	b := p.Bytes()
	return b >= bulkBytes && b/(p.Turns()+1) >= interactiveBytes
}

// chooser holds the choices of every link of a relay.
type chooser struct {
	mu     sync.Mutex
	links  map[string]*linkChoice
	shapes map[string]*shape
	// watched: the open flows of Tunnels of unknown shape that ride QUIC
	// on a lossy link, until one shows it is bulk.
	watched map[string][]progress
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

// linkLoss is what a link's connections show of its loss, asked only as
// far as a choice needs.
type linkLoss interface {
	// QUIC is the packets the QUIC connections to the peer sent and lost.
	QUIC() (sent, lost uint64)
	// OpenTLS is the segments the TLS flows open to the peer sent and
	// retransmitted so far.
	OpenTLS() (sent, retransmitted uint64)
	// RTT is the link's least round trip seen (its QUIC connection's), 0
	// when unknown: what the path costs, without the queues and the busy
	// host that a smoothed figure carries (10 ms on a 0.4 ms link of a
	// loaded machine), which would make a LAN look long.
	RTT() time.Duration
}

// pick chooses the transport of a new flow of tunnel to peer; m is what
// the flow will have moved, watched while the flow rides QUIC for a guess
// (unwatch ends it). loss is asked only when the Tunnel's shape is not
// known, for a packet session, or once in cleanFor for a link when the
// Tunnel's flows are long-lived interactive.
// Packet sessions pass isFlow false and m nil: they are bulk, and short
// flows do not apply. bulk says the Tunnel's flows are known to be bulk
// (worth a handshake).
func (c *chooser) pick(peer, tunnel string, isFlow bool, m progress, loss linkLoss, now time.Time) (t v1alpha1.Transport, reason string, bulk bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.shapes[tunnel]
	known := s != nil && s.n >= shortFlows
	l := c.link(peer)
	if isFlow && known && (s.avg < shortBytes || s.perTurn < interactiveBytes) {
		if s.turns >= longTurns && cleanShortLink(l, loss, now) {
			return v1alpha1.TransportTLS, ReasonLongInteractive, true
		}
		if s.avg < shortBytes {
			return v1alpha1.TransportQUIC, ReasonShort, false
		}
		return v1alpha1.TransportQUIC, ReasonInteractive, false
	}
	bulk = !isFlow || known
	bound := false // QUIC would bind a bulk flow of unknown shape
	c.decide(peer, l, now)
	if !known || !isFlow {
		sent, lost := loss.QUIC()
		if !isFlow && l.reason != ReasonMeasured && lossy(sent+l.tcpSent, lost+l.tcpLost) {
			// Packets of TCP flows inside a TLS connection would be
			// retransmitted twice, each layer stalling the other.
			return v1alpha1.TransportQUIC, ReasonLossy, bulk
		}
		ratio := 0.0
		if isFlow {
			ratio = lossRatio(l, sent, lost, loss)
		}
		if ratio > 0 {
			switch {
			case quicBinds(l, ratio, loss.RTT()):
				// A bulk flow over QUIC would be bound far below what
				// the link carries, for its whole life; a request over
				// TCP pays a retransmission timeout per lost packet,
				// which on a long link is a round trip or two. Worth a
				// handshake, not a ride on QUIC meanwhile.
				bound, bulk = true, true
			case !c.bulkSeen(tunnel, s):
				// Bulk or not, the flow shows what it is as it goes;
				// meanwhile a request/response flow is spared TCP's
				// retransmission timeouts.
				c.watch(tunnel, m)
				return v1alpha1.TransportQUIC, ReasonLossy, false
			default:
				bulk = true // one flow said enough
			}
		}
	}
	if isFlow {
		l.turn++
		if o := other(l.bulk); l.turn%sampleEvery == 0 && !l.rate[o].fresh(now) && couldWin(l, o, loss) {
			return o, ReasonSampling, bulk
		}
	}
	if bound && l.reason != ReasonMeasured {
		return l.bulk, ReasonLossBound, bulk
	}
	return l.bulk, l.reason, bulk
}

// cleanShortLink says whether a link is short (its least round trip, which
// must be known, within shortLinkRTT) and shows no loss, as it did within
// cleanFor.
func cleanShortLink(l *linkChoice, loss linkLoss, now time.Time) bool {
	if !l.cleanAt.IsZero() && now.Sub(l.cleanAt) >= 0 && now.Sub(l.cleanAt) < cleanFor {
		return l.clean
	}
	l.clean, l.cleanAt = false, now
	if rtt := loss.RTT(); rtt <= 0 || rtt > shortLinkRTT {
		return false
	}
	sent, lost := loss.QUIC()
	l.clean = lossRatio(l, sent, lost, loss) == 0
	return l.clean
}

// quicBinds says whether a flow of unknown shape on a link that loses
// ratio of its packets at a round trip of rtt loses more as a bulk flow
// over QUIC than as requests and answers over TCP, both as the fraction of
// its time added. Over QUIC a bulk flow is bound near quicCeiling, and
// takes rate/ceiling times as long as over TLS, rate being what TLS flows
// carried on the link, or guessRate before any did. Over TCP each request
// and each answer is a lone packet, lost with ratio, and waits two round
// trips and tcpMinRTO more for it. On a LAN at 1% loss TCP's timeout is
// hundreds of round trips and QUIC's ceiling near 300 Mbit/s: QUIC; at
// 20 ms and 1% the timeout is 12 round trips (a quarter more for
// requests) and the ceiling 17 Mbit/s (a bulk flow six times as long): TLS.
func quicBinds(l *linkChoice, ratio float64, rtt time.Duration) bool {
	if ratio <= 0 || rtt <= 0 {
		return false
	}
	rate := guessRate
	if tls := l.rate[v1alpha1.TransportTLS]; tls.n > 0 {
		rate = tls.bps
	}
	bulkCost := rate/quicCeiling(ratio, rtt) - 1
	requestCost := 2 * ratio * (2*rtt + tcpMinRTO).Seconds() / rtt.Seconds()
	return bulkCost > requestCost
}

// couldWin says whether a sample of transport o could make it the link's
// bulk transport. A sample is a bulk flow given to o for its whole life,
// and on a long lossy link QUIC's is lost before it starts: quic-go's
// congestion control (a loss-based one, which the relay cannot swap)
// keeps at most about MSS/RTT * 1.22/sqrt(loss), the steady rate of a
// loss-based sender (Mathis et al.), twice that here for safety. When even
// that, with the margin a switch needs, is below what the other transport
// already carried on the link, the sample could not win and only costs its
// flow: 1% loss at 152 ms bounds QUIC near 2 Mbit/s where TLS over bbr
// carried 60. TLS is always worth a sample: its congestion control may be
// bbr, which loss does not bound so.
func couldWin(l *linkChoice, o v1alpha1.Transport, loss linkLoss) bool {
	cur := l.rate[other(o)]
	if o != v1alpha1.TransportQUIC || cur.n == 0 {
		return true
	}
	sent, lost := loss.QUIC()
	rtt := loss.RTT()
	if sent < lossPackets || lost < losesLost || rtt <= 0 {
		return true
	}
	return switchMargin*quicCeiling(float64(lost)/float64(sent), rtt) >= cur.bps
}

// quicCeiling is twice the steady rate, in bit/s, of a loss-based sender
// that loses ratio of its packets at a round trip of rtt.
func quicCeiling(ratio float64, rtt time.Duration) float64 {
	const mss = 1400 * 8 // bits
	return 2 * mss * 1.22 / (rtt.Seconds() * math.Sqrt(ratio))
}

// bulkSeen says whether the Tunnel's last finished flow, or one of its
// watched open flows, was bulk.
func (c *chooser) bulkSeen(tunnel string, s *shape) bool {
	if s != nil && s.lastBulk {
		return true
	}
	for _, p := range c.watched[tunnel] {
		if bulkSoFar(p) {
			return true
		}
	}
	return false
}

// watch adds an open flow of tunnel to those watched.
func (c *chooser) watch(tunnel string, m progress) {
	if m == nil {
		return
	}
	if c.watched == nil {
		c.watched = map[string][]progress{}
	}
	w, ok := c.watched[tunnel]
	if !ok && len(c.watched) >= maxShapes {
		clear(c.watched)
	}
	if len(w) >= watchFlows {
		w = append(w[:0], w[1:]...)
	}
	c.watched[tunnel] = append(w, m)
}

// unwatch forgets a flow of tunnel that ended (or never opened).
func (c *chooser) unwatch(tunnel string, m progress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.watched[tunnel]
	for i, p := range w {
		if p == m {
			w = append(w[:i], w[i+1:]...)
			break
		}
	}
	if len(w) == 0 {
		delete(c.watched, tunnel)
		return
	}
	c.watched[tunnel] = w
}

// lossy says whether lost of sent packets make a link lossy.
func lossy(sent, lost uint64) bool {
	return sent >= lossPackets && float64(lost) >= lossyLink*float64(sent)
}

// lossRatio is the loss a link shows, as a flow of unknown shape counts
// it: the higher ratio of QUIC's counts (quicSent, quicLost) and its
// finished TLS flows', or else its open TLS flows'; 0 when none shows
// loss. Each count on its own: QUIC's are mostly of lone packets, TCP's of
// TLS flows' segments, often a thousand times as many, which in a sum
// would drown the other. The open flows are asked only when the others
// say nothing, since asking walks them.
func lossRatio(l *linkChoice, quicSent, quicLost uint64, loss linkLoss) float64 {
	r := max(ratioIfLoses(quicSent, quicLost), ratioIfLoses(l.tcpSent, l.tcpLost))
	if r > 0 {
		return r
	}
	return ratioIfLoses(loss.OpenTLS())
}

// ratioIfLoses is lost of sent when they show loss (loses), else 0.
func ratioIfLoses(sent, lost uint64) float64 {
	if !loses(sent, lost) {
		return 0
	}
	return float64(lost) / float64(max(sent, lost))
}

// loses says whether lost of sent packets show loss.
func loses(sent, lost uint64) bool {
	return lost >= losesLost && float64(lost) >= losesRatio*float64(sent)
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
		s = &shape{avg: float64(bytes), perTurn: perTurn, turns: float64(turns)}
		c.shapes[tunnel] = s
	} else {
		s.avg += (float64(bytes) - s.avg) / 8
		s.perTurn += (perTurn - s.perTurn) / 8
		s.turns += (float64(turns) - s.turns) / 8
	}
	s.n++
	// An interactive flow's goodput says how often it turned, not how fast
	// the transport is.
	s.lastBulk = bytes >= bulkBytes && perTurn >= interactiveBytes
	if !s.lastBulk || active <= 0 {
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
