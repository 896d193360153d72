package relay

import (
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// middle joins the two hops of a session that came over QUIC (one that
// came over TLS is a byte stream, joined as a TCP flow is: tcpFlows.middle).
// Packets are re-keyed to the next connection's flow id and re-sent as
// datagram or frame as that hop allows.
func (f *udpFlows) middle(from *nexthop.Hop, h *hop.Header, t *v1alpha1.Tunnel) {
	fc, done := f.begin(h.Tunnel, "middle")
	defer done()
	ctx, cancel := f.setupContext()
	next, err := f.hops.Open(ctx, nexthop.Onward(h), nexthop.OpenOptions{Came: from.Transport})
	cancel()
	if err != nil {
		f.hopFailed(h.Tunnel, err)
		from.Refuse(hop.CodeNextHop)
		return
	}
	gauge := f.m.UDPSessions.WithLabelValues(f.name, h.Tunnel, "middle")
	gauge.Inc()
	defer gauge.Dec()
	// Each way within the Tunnel's share of the link it goes into.
	fairUp, shareUp, leaveUp := f.shareDatagrams(t, next.Peer)
	defer leaveUp()
	fairDown, shareDown, leaveDown := f.shareDatagrams(t, from.Peer)
	defer leaveDown()
	back, onward := from.Session(nexthop.SessionOptions{Share: shareDown}), next.Session(nexthop.SessionOptions{Share: shareUp})
	// Datagrams go on as datagrams, frames as frames: the ends chose.
	relay := func(send func([]byte) error, fair *fairDatagrams, n flow.Counter) func([]byte) {
		return func(p []byte) {
			if !fair.admit(len(p)) {
				return
			}
			fair.start()
			err := send(p)
			fair.end(sentLen(p, err))
			if err != nil {
				f.m.UDPDropped.WithLabelValues(f.name, h.Tunnel, "send_failed").Inc()
				return
			}
			n.Add(float64(len(p)))
		}
	}
	onward.Receive(relay(back.Send, fairDown, fc.down))
	back.Receive(relay(onward.Send, fairUp, fc.up))
	// The side that ended first, and how: a broken one is counted under it.
	type end struct {
		side string
		err  error
	}
	ended := make(chan end, 2)
	// Frames are queued onward and flushed when no more are waiting, so a
	// burst leaves in full-size packets as it came.
	flush := func(s nexthop.Session, fair *fairDatagrams) func() {
		return func() {
			fair.start()
			s.Flush()
			fair.end(0)
		}
	}
	go func() {
		ended <- end{sidePrevHop, back.ReadFrames(relay(onward.Queue, fairUp, fc.up), flush(onward, fairUp))}
	}()
	go func() {
		ended <- end{sideNextHop, onward.ReadFrames(relay(back.Queue, fairDown, fc.down), flush(back, fairDown))}
	}()
	// Either side's end ends the session on both, passed on as it came: a
	// relay's code as sent, a lost connection as a reset.
	first := <-ended
	code, _, reset := flow.ResetCode(first.err)
	if !reset {
		code = hop.CodeIdle
	}
	if hopBroken(first.err) {
		f.flowError(h.Tunnel, first.side)
		if !reset {
			code = hop.CodeReset
		}
	}
	back.End(code)
	onward.End(code)
	<-ended
}
