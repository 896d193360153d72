package quic

import (
	"time"

	"github.com/hoplink/hoplink/relay/hop"
)

// The loss of a link as the receiving end saw it. quic-go counts a packet
// lost when later packets were acknowledged and it was not; a packet sent
// alone (an interactive flow's request or answer) has none after it, so
// its loss goes to a probe timeout, which retransmits without counting
// anything lost. On a link that carries only such flows, quic-go's count
// stays at zero however much the link loses. So each end tells the other,
// four times a second while it sends, how many packets it sent on the
// connection (hop.CountFlow); the other answers with that count and how
// many it received (hop.CountEchoFlow), and the difference is what the
// link lost on the way.

// reportMin is how many packets a connection must have sent since its last
// report to send another: a report, its answer's ACK and a keep-alive do
// not keep an idle connection reporting.
const reportMin = 4

// reportSent sends the packets sent so far, if the connection was busy
// since the last report. One goroutine (the endpoint's loss sampler) calls
// it.
func (c *Conn) reportSent() {
	sent := c.ConnectionStats().PacketsSent
	if sent < c.reported+reportMin {
		return
	}
	c.reported = sent
	c.SendDatagram(hop.AppendDatagram(nil, hop.CountFlow, hop.AppendCounts(nil, sent))) // a report lost is skipped
}

// answerCounts answers a peer's report of packets sent with what this end
// received of them so far.
func (c *Conn) answerCounts(payload []byte) error {
	var sent uint64
	if err := hop.ParseCounts(payload, &sent); err != nil {
		return err
	}
	received := c.ConnectionStats().PacketsReceived
	c.SendDatagram(hop.AppendDatagram(nil, hop.CountEchoFlow, hop.AppendCounts(nil, sent, received))) // as a report lost
	return nil
}

// reportGrace, handshakeSlack: of the packets sent in the first second
// after a connection's handshake, up to 4 that the peer had not received
// are not loss. quic-go counts a packet received only once it could open
// it, and a handshake leaves a packet or two it cannot: a Handshake packet
// that arrives after the peer dropped its Handshake keys (a retransmission
// or a probe, which a busy host sends the more). On a clean loopback link
// between loaded relays the count said 1-2 packets lost of the first 20,
// which made the link lossy for auto and put a whole round of interactive
// flows on QUIC (hack/bench/rr.sh). The slack is bounded so that a link
// that loses more in that second still shows it.
const (
	reportGrace    = time.Second
	handshakeSlack = 4
)

// start and sinceStart are a monotonic clock for born: a wall clock set
// back would stretch the grace.
var start = time.Now()

func sinceStart() int64 { return int64(time.Since(start)) + 1 }

// peerCounts takes the peer's answer: of the packets sent before the
// report, those it had not received when the report arrived were lost (on
// a link that keeps packets in order; one that reorders makes a loss of a
// packet the report overtook), less what it had not received of the
// packets of the handshake's first second, as answers in that second said
// (reportGrace, at most handshakeSlack). What arrived after the report
// only lowers the figure. The count kept is the highest seen, so it never
// goes down. One goroutine, the reader of QUIC datagrams, calls it.
func (c *Conn) peerCounts(payload []byte) error {
	var sent, received uint64
	if err := hop.ParseCounts(payload, &sent, &received); err != nil {
		return err
	}
	missing := sent - min(sent, received)
	if born := c.born.Load(); born != 0 && sinceStart()-born < int64(reportGrace) {
		if base := min(missing, handshakeSlack); base > c.peerBase.Load() {
			c.peerBase.Store(base)
		}
		return nil
	}
	if lost := missing - min(missing, c.peerBase.Load()); lost > c.peerLost.Load() {
		c.peerLost.Store(lost)
	}
	return nil
}

// lossCounts are the packets this end sent on the connection and how many
// of them the link lost: the larger of quic-go's count and the peer's, and
// never more than were sent, whatever a peer answers.
func (c *Conn) lossCounts() counts {
	st := c.ConnectionStats()
	return counts{sent: st.PacketsSent, lost: min(max(st.PacketsLost, c.peerLost.Load()), st.PacketsSent)}
}
