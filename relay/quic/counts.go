package quic

import "github.com/hoplink/hoplink/relay/hop"

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

// unseenSlack: up to 6 packets that the peer never received are not the
// link's loss, since quic-go sends some that cannot arrive and does not
// count them lost. It counts a packet received only once it could open
// it, and a handshake leaves a packet or two it cannot: a Handshake packet
// that arrives after the peer dropped its Handshake keys (a retransmission
// or a probe, which a busy host sends the more). And path MTU discovery
// probes sizes larger than the path may carry, giving a size up after 3
// probes of it are lost: on a path whose MTU is below quic-go's largest
// packet the peer misses 3 (MTU 1,400) or 2 (1,450, an overlay's). Counted,
// they made a clean link lossy for good: the link chooser kept interactive
// flows off TLS, and lone packets went twice; between loaded relays on
// loopback a whole round of interactive flows rode QUIC for 1-2 packets
// of a handshake (hack/bench/rr.sh). A connection's count goes on from
// the slack, so a link that loses packets still shows it within a few
// more.
const unseenSlack = 6

// peerCounts takes the peer's answer: of the packets sent before the
// report, those it had not received when the report arrived were lost (on
// a link that keeps packets in order; one that reorders makes a loss of a
// packet the report overtook), less unseenSlack. What arrived after the
// report only lowers the figure. The count kept is the highest seen, so it
// never goes down. One goroutine, the reader of QUIC datagrams, calls it.
func (c *Conn) peerCounts(payload []byte) error {
	var sent, received uint64
	if err := hop.ParseCounts(payload, &sent, &received); err != nil {
		return err
	}
	missing := sent - min(sent, received)
	if lost := missing - min(missing, unseenSlack); lost > c.peerLost.Load() {
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
