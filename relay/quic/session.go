package quic

import (
	"bufio"
	"errors"
	"io"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/hoplink/hoplink/relay/hop"
)

// Session is a datagram session over one hop (a UDP session, a packet-mode
// Tunnel's packets): its packets ride datagrams keyed by the session
// stream's id, and the stream marks the session's life (closing it ends the
// session at every hop) and carries, as frames, packets too large for a
// datagram, so that nothing is dropped for size. Datagram limits differ per
// connection (path MTU discovery runs on each), so every hop decides again.
//
// A session in stream mode frames every packet on its stream: nothing is
// dropped between relays and packets go full-size (GSO batches them), at
// the cost of ordering and retransmission. quic-go sends each datagram in
// a packet and a system call of its own, and past some tens of thousands
// a second on a busy host its datagram queue backs up and the entry's
// socket drops; bulk UDP fares better framed.
type Session struct {
	Conn   *Conn
	Stream *quicgo.Stream
	id     uint64

	frames *hop.Frames // frames waiting for Flush

	framed   atomic.Bool
	auto     bool
	rate     int64 // datagrams a second from which Auto frames; 0: AutoFramesRate
	onFramed func()
	win      Rate
	share    *Share // nil: none
}

// Share says whose a session's datagrams are where a datagram channel
// queues them (dgQueue): Tunnels take turns by weight, whatever their
// number of sessions. The transport knows no Tunnels: Key is opaque.
type Share struct {
	// Key names the Tunnel; sessions of one Key share its turns.
	Key string
	// Weight is its share against the other Keys' (below 1: 1).
	Weight int
	// Dropped (may be nil) is told of each of the session's datagrams (its
	// payload's size) the channel dropped after taking it: its queue was
	// full or it waited past the lag bound. It runs under the channel's
	// lock and must not block.
	Dropped func(n int)
	// Lost (may be nil) is told of bytes of the session's datagrams the
	// link lost past this relay, as the peer's feedback on the channel
	// shows: its share, by bytes sent, of the loss over an interval.
	// Random loss counts too, so it says nothing of congestion. It runs
	// under the channel's lock and must not block.
	Lost func(n int)
}

// SetShare sets whose the session's datagrams are (nil: none). Set it
// before the first Send.
func (s *Session) SetShare(sh *Share) { s.share = sh }

// Modes of a session's Send.
type Mode int

const (
	// Datagrams sends each packet as a datagram (frames when too large).
	Datagrams Mode = iota
	// Frames frames every packet on the stream.
	Frames
	// Auto sends datagrams until the session sends more than
	// AutoFramesRate a second, frames from then on.
	Auto
)

// AutoFramesRate is the datagram rate from which an Auto session frames.
const AutoFramesRate = 16000

// autoWindow is the window Auto counts a session's rate over.
const autoWindow = 100 * time.Millisecond

var epoch = time.Now()

// SetMode sets how Send sends; onFramed (may be nil) is told once when an
// Auto session turns to frames. Set it before the first Send.
func (s *Session) SetMode(m Mode, onFramed func()) {
	s.framed.Store(m == Frames)
	s.auto = m == Auto
	s.onFramed = onFramed
}

// BoundWrites makes every write of the session's frames fail after d
// (hop.Frames.Stall), which the owner answers by ending the session. Call
// it before the first Send.
func (s *Session) BoundWrites(d time.Duration) { s.frames.Stall = d }

// Framed reports whether Send frames every packet now.
func (s *Session) Framed() bool { return s.framed.Load() }

// busy counts one packet of an Auto session and reports whether its rate
// passed AutoFramesRate over the current window.
func (s *Session) busy() bool {
	rate := s.rate
	if rate == 0 {
		rate = AutoFramesRate
	}
	return s.win.Over(rate)
}

// Rate counts a session's packets over windows of autoWindow.
type Rate struct{ start, count atomic.Int64 }

// Over counts one packet and reports whether the current window passed
// perSecond.
func (r *Rate) Over(perSecond int64) bool {
	now := int64(time.Since(epoch))
	if start := r.start.Load(); now-start > int64(autoWindow) {
		r.start.Store(now)
		r.count.Store(1)
		return false
	}
	return r.count.Add(1) > perSecond*int64(autoWindow)/int64(time.Second)
}

// NewSession makes a session of stream s on connection c.
func NewSession(c *Conn, s *quicgo.Stream) *Session {
	return &Session{Conn: c, Stream: s, id: uint64(s.StreamID()), frames: &hop.Frames{W: s}}
}

// Send sends one packet as the session's mode says: a datagram when it
// fits the connection's current datagram size, else a frame on the stream.
// In stream mode the frame waits for Flush (or 32 KiB of others): a caller
// of a session that may frame flushes after each burst, so frames leave
// together in full-size packets.
func (s *Session) Send(p []byte) error {
	if s.framed.Load() {
		return s.Queue(p)
	}
	if s.auto && s.busy() && s.framed.CompareAndSwap(false, true) {
		if s.onFramed != nil {
			s.onFramed()
		}
		return s.Queue(p)
	}
	err := s.Conn.sendFlowDatagram(s.id, s.share, p)
	var tooLarge *quicgo.DatagramTooLargeError
	if !errors.As(err, &tooLarge) {
		return err
	}
	return s.SendFrame(p)
}

// SendFrame sends one packet framed on the stream now, with any queued.
func (s *Session) SendFrame(p []byte) error {
	if err := s.Queue(p); err != nil {
		return err
	}
	return s.Flush()
}

// Queue frames p after the frames waiting for Flush (or 32 KiB of them).
func (s *Session) Queue(p []byte) error { return s.frames.Queue(p) }

// Flush writes the frames queued.
func (s *Session) Flush() error { return s.frames.Flush() }

// Receive routes the session's datagrams to sink (see Conn.Register).
func (s *Session) Receive(sink func([]byte)) { s.Conn.Register(s.id, sink) }

// Stop stops routing the session's datagrams.
func (s *Session) Stop() { s.Conn.Unregister(s.id) }

// ReadFrames hands every packet framed on the stream to deliver until the
// stream ends. drained (may be nil) is told when no frame is waiting, so a
// caller that queues frames onward can flush them.
func (s *Session) ReadFrames(deliver func([]byte), drained func()) error {
	buf := make([]byte, hop.MaxFrame)
	// Read through a buffer once frames come in numbers (stream mode):
	// then a read takes many frames, not two reads per frame. Sessions
	// that frame only the odd oversize packet never hold it.
	var r io.Reader = s.Stream
	var br *bufio.Reader
	for n := 0; ; n++ {
		if n == 64 {
			br = bufio.NewReaderSize(s.Stream, 16<<10)
			r = br
		}
		if drained != nil && (br == nil || br.Buffered() == 0) {
			drained()
		}
		p, err := hop.ReadFrame(r, buf)
		if err != nil {
			return err
		}
		deliver(p)
	}
}

// MSS is the TCP MSS whose segments (of this IP packet's version) fill one
// datagram of this hop: a full-size segment then makes a full-size QUIC
// packet, which keeps quic-go's GSO batches going.
func (s *Session) MSS(ipPacket []byte) uint16 {
	hdr := 20
	if len(ipPacket) > 0 && ipPacket[0]>>4 == 6 {
		hdr = 40
	}
	return uint16(max(s.Conn.MaxDatagram()-quicvarint.Len(s.id)-hdr-20, 536))
}
