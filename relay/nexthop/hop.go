package nexthop

import (
	"net"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Hop is one hop of a flow or a session, to or from a peer relay, whatever
// transport carries it: the one value every role opens (Hops.Open), serves
// (Upper.Serve) and ends. Its byte stream carries a TCP flow, a trace, a
// link request, or a session's packets as frames; a session's packets also
// ride the QUIC connection's datagrams where there is one (Session).
type Hop struct {
	// Peer is the relay at the other end, Remote where it is.
	Peer   string
	Remote net.Addr
	// Transport is what carries it: quic or tls.
	Transport v1alpha1.Transport
	// Choice says why an opened hop took its transport, and learns from
	// its flow (nil on hops peers opened).
	Choice *Choice

	end flow.End
	// Over QUIC, the connection and the stream.
	conn   *rquic.Conn
	stream *quicgo.Stream
}

// quicHop is a hop on stream s of c, whose byte stream is end.
func quicHop(c *rquic.Conn, s *quicgo.Stream, end flow.End) *Hop {
	return &Hop{Peer: c.Peer, Remote: c.RemoteAddr(), Transport: v1alpha1.TransportQUIC, end: end, conn: c, stream: s}
}

// tlsHop is a hop on a TLS connection, whose byte stream is end.
func tlsHop(peer string, remote net.Addr, end flow.End) *Hop {
	return &Hop{Peer: peer, Remote: remote, Transport: v1alpha1.TransportTLS, end: end}
}

// Stream is the hop's byte stream.
func (h *Hop) Stream() flow.End { return h.end }

// SetDeadline bounds the reads and writes of the hop's stream that
// follow.
func (h *Hop) SetDeadline(t time.Time) error {
	return h.end.(interface{ SetDeadline(time.Time) error }).SetDeadline(t)
}

// Refuse ends a hop this relay does not serve, with code for the peer
// (over TLS the peer sees a reset only).
func (h *Hop) Refuse(code hop.Code) { h.end.Fail(code) }

// Admitted says the relay admitted what the peer opened: over QUIC, the
// connection is the peer's link from now on, whose drain news counts.
func (h *Hop) Admitted() {
	if h.conn != nil {
		h.conn.Admitted()
	}
}

// Session is the hop as a UDP or packet session.
func (h *Hop) Session(o SessionOptions) Session {
	if h.conn == nil {
		return newTLSSession(h.end, o)
	}
	return newQUICSession(h.conn, h.stream, o)
}
