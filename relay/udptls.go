package relay

import (
	"bufio"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// udpHop is a UDP session's hop as its entry and exit use it: packets
// sent (Send may hold them until Flush), packets received on the stream
// until the hop ends, and its end. Over QUIC it is an rquic.Session, whose
// datagrams arrive through the sink its owner registered; over TLS a byte
// stream of frames, nothing else.
type udpHop interface {
	Send(p []byte) error
	Flush() error
	ReadFrames(deliver func([]byte)) error
	End(code hop.Code)
	// BoundWrites makes a write of frames fail after d (hop.Frames.Stall).
	BoundWrites(d time.Duration)
}

// The entry bounds its writes to a session's hop (hop.Frames.Stall), which
// needs both kinds of hop to take a write deadline.
var (
	_ interface{ SetWriteDeadline(time.Time) error } = (*flow.TLSEnd)(nil)
	_ interface{ SetWriteDeadline(time.Time) error } = (*quicgo.Stream)(nil)
)

// quicHop is a session's hop over QUIC.
type quicHop struct{ *rquic.Session }

func (q quicHop) ReadFrames(deliver func([]byte)) error { return q.Session.ReadFrames(deliver, nil) }

// End stops routing the session's datagrams and resets its stream.
func (q quicHop) End(code hop.Code) {
	q.Stop()
	flow.Reset(q.Stream, code)
}

// tlsHop is a session's hop over TLS: every packet framed (hop.AppendFrame)
// on the connection, as in a QUIC session's stream mode.
type tlsHop struct {
	end flow.End

	frames *hop.Frames // waiting for Flush

	// bulk is told, at most once a minute, that the session sends at a
	// bulk rate (nil at the exit).
	bulk   func()
	rate   rquic.Rate
	toldAt atomic.Int64 // unix nanos
}

func newTLSHop(end flow.End, bulk func()) *tlsHop {
	return &tlsHop{end: end, frames: &hop.Frames{W: end}, bulk: bulk}
}

func (t *tlsHop) Send(p []byte) error {
	if t.bulk != nil && t.rate.Over(rquic.AutoFramesRate) {
		if now, told := time.Now().UnixNano(), t.toldAt.Load(); now-told > int64(time.Minute) && t.toldAt.CompareAndSwap(told, now) {
			t.bulk()
		}
	}
	return t.frames.Queue(p)
}

func (t *tlsHop) Flush() error { return t.frames.Flush() }

func (t *tlsHop) BoundWrites(d time.Duration) { t.frames.Stall = d }

// ReadFrames reads through a buffer: a TLS read returns at most one
// record, and a frame takes two reads.
func (t *tlsHop) ReadFrames(deliver func([]byte)) error {
	r := bufio.NewReaderSize(t.end, 32<<10)
	buf := make([]byte, hop.MaxFrame)
	for {
		p, err := hop.ReadFrame(r, buf)
		if err != nil {
			return err
		}
		deliver(p)
	}
}

// End closes the hop: an idle end or a shutdown with close_notify, which
// the far side reads as the session's end; anything else with a reset.
func (t *tlsHop) End(code hop.Code) {
	if code == hop.CodeIdle || code == hop.CodeShutdown {
		t.end.CloseWrite()
		t.end.Close()
		return
	}
	t.end.Abort()
}
