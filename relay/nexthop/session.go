package nexthop

import (
	"bufio"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Session is a UDP or packet session's hop: its packets, as the transport
// carries them. Over QUIC a packet rides a datagram (a frame on the hop's
// stream when too large, or in stream mode), over TLS a frame on the
// connection; frames wait for Flush (or 32 KiB of others), so a caller
// flushes after each burst. The hop's stream marks the session's life:
// ReadFrames returns when it ends, and End ends it at every hop.
type Session interface {
	// Send sends a packet as the session's mode says.
	Send(p []byte) error
	// Queue frames a packet, whatever the mode (a middle relay passes a
	// frame on as one).
	Queue(p []byte) error
	Flush() error
	// Receive routes the datagrams of the session to sink; over TLS none
	// come (every packet is a frame).
	Receive(sink func([]byte))
	// ReadFrames hands every framed packet to deliver until the hop ends;
	// drained (may be nil) is told when no frame is waiting.
	ReadFrames(deliver func([]byte), drained func()) error
	// End ends the session with code: over TLS an idle end or a shutdown
	// closes with close_notify, which the far side reads as an end.
	End(code hop.Code)
	// MSS is the TCP MSS whose segments fill one datagram (0 over TLS,
	// whose frames take any size).
	MSS(ipPacket []byte) uint16
}

// Mode is how a QUIC session sends its packets (rquic.Mode).
type Mode = rquic.Mode

// The modes.
const (
	Datagrams = rquic.Datagrams
	Frames    = rquic.Frames
	Auto      = rquic.Auto
)

// MaxTunnelLinks is how many QUIC links, besides the control link, one
// relay dials to a peer for its Tunnels (rquic.MaxTunnelLinks).
const MaxTunnelLinks = rquic.MaxTunnelLinks

// AutoFramesRate is the packet rate from which an Auto session frames,
// and a TLS session is told it is bulk.
const AutoFramesRate = rquic.AutoFramesRate

// SessionOptions shape a Session.
type SessionOptions struct {
	// Mode is a QUIC session's (TLS frames every packet).
	Mode Mode
	// Bulk (may be nil) is told that the session sends at a bulk rate:
	// once when an Auto QUIC session turns to frames for it (framed), and
	// at most once a minute while a TLS session sends past AutoFramesRate.
	Bulk func(framed bool)
	// Stall bounds a write of frames (hop.Frames.Stall): a next hop that
	// takes none for this long fails it, and the owner ends the session.
	Stall time.Duration
	// Share (may be nil) is whose the session's datagrams are, where a
	// QUIC connection's datagram channel queues them: Tunnels take turns
	// by weight, then their sessions (rquic.Share).
	Share *Share
}

// Share is whose a session's datagrams are (rquic.Share).
type Share = rquic.Share

// A session's frames may be bounded in time (SessionOptions.Stall), which
// needs both kinds of hop to take a write deadline.
var (
	_ interface{ SetWriteDeadline(time.Time) error } = (*flow.TLSEnd)(nil)
	_ interface{ SetWriteDeadline(time.Time) error } = (*quicgo.Stream)(nil)
)

// quicSession is a session over QUIC: an rquic.Session.
type quicSession struct{ *rquic.Session }

func newQUICSession(c *rquic.Conn, s *quicgo.Stream, o SessionOptions) Session {
	out := rquic.NewSession(c, s)
	var onFramed func()
	if bulk := o.Bulk; bulk != nil {
		onFramed = func() { bulk(true) }
	}
	out.SetMode(o.Mode, onFramed)
	out.SetShare(o.Share)
	if o.Stall > 0 {
		out.BoundWrites(o.Stall)
	}
	return quicSession{out}
}

func (q quicSession) End(code hop.Code) {
	q.Stop()
	flow.Reset(q.Stream, code)
}

// tlsSession is a session over TLS: every packet framed (hop.AppendFrame)
// on the connection, as in a QUIC session's stream mode.
type tlsSession struct {
	end    flow.End
	frames *hop.Frames // waiting for Flush

	bulk   func(framed bool) // may be nil
	rate   rquic.Rate
	toldAt atomic.Int64 // unix nanos
}

func newTLSSession(end flow.End, o SessionOptions) Session {
	return &tlsSession{end: end, frames: &hop.Frames{W: end, Stall: o.Stall}, bulk: o.Bulk}
}

func (t *tlsSession) Send(p []byte) error {
	if t.bulk != nil && t.rate.Over(AutoFramesRate) {
		if now, told := time.Now().UnixNano(), t.toldAt.Load(); now-told > int64(time.Minute) && t.toldAt.CompareAndSwap(told, now) {
			t.bulk(false)
		}
	}
	return t.frames.Queue(p)
}

func (t *tlsSession) Queue(p []byte) error       { return t.frames.Queue(p) }
func (t *tlsSession) Flush() error               { return t.frames.Flush() }
func (t *tlsSession) Receive(func([]byte))       {}
func (t *tlsSession) MSS(ipPacket []byte) uint16 { return 0 }

// ReadFrames reads through a buffer: a TLS read returns at most one
// record, and a frame takes two reads.
func (t *tlsSession) ReadFrames(deliver func([]byte), drained func()) error {
	r := bufio.NewReaderSize(t.end, 32<<10)
	buf := make([]byte, hop.MaxFrame)
	for {
		if drained != nil && r.Buffered() == 0 {
			drained()
		}
		p, err := hop.ReadFrame(r, buf)
		if err != nil {
			return err
		}
		deliver(p)
	}
}

func (t *tlsSession) End(code hop.Code) {
	if code == hop.CodeIdle || code == hop.CodeShutdown {
		t.end.CloseWrite()
		t.end.Close()
		return
	}
	t.end.Abort()
}
