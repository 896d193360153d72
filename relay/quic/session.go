package quic

import (
	"errors"
	"sync"

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
type Session struct {
	Conn   *Conn
	Stream *quicgo.Stream
	id     uint64

	mu    sync.Mutex // serializes frame writes
	frame []byte
}

// NewSession makes a session of stream s on connection c.
func NewSession(c *Conn, s *quicgo.Stream) *Session {
	return &Session{Conn: c, Stream: s, id: uint64(s.StreamID())}
}

// Send sends one packet: a datagram when it fits the connection's current
// datagram size, else a frame on the stream.
func (s *Session) Send(p []byte) error {
	err := s.Conn.SendFlowDatagram(s.id, p)
	var tooLarge *quicgo.DatagramTooLargeError
	if !errors.As(err, &tooLarge) {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frame == nil {
		s.frame = make([]byte, 0, 2+hop.MaxFrame)
	}
	return hop.WriteFrame(s.Stream, s.frame, p)
}

// Receive routes the session's datagrams to sink (see Conn.Register).
func (s *Session) Receive(sink func([]byte)) { s.Conn.Register(s.id, sink) }

// Stop stops routing the session's datagrams.
func (s *Session) Stop() { s.Conn.Unregister(s.id) }

// ReadFrames hands every packet framed on the stream to deliver until the
// stream ends.
func (s *Session) ReadFrames(deliver func([]byte)) error {
	buf := make([]byte, hop.MaxFrame)
	for {
		p, err := hop.ReadFrame(s.Stream, buf)
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
