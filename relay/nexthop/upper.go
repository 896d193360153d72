package nexthop

import (
	"crypto/tls"
	"net"

	quicgo "github.com/quic-go/quic-go"

	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Upper is the layer above the link layer (the relay's dispatcher), its
// one way in: what peers open over either transport, and what the link
// layer learns of them.
type Upper interface {
	// Serve serves what a peer opened, on a goroutine of its own; it owns
	// it.
	Serve(in Inbound)
	// Event hears what the link layer learned of a peer. It must not
	// block: it runs on the transports' goroutines.
	Event(e Event)
}

// Inbound is what a peer opened: a stream on a QUIC connection, or a TLS
// connection.
type Inbound struct {
	Peer string
	// Conn and Stream: over QUIC.
	Conn   *rquic.Conn
	Stream *quicgo.Stream
	// TLS: over TLS. Its read deadline bounds the wait for its header;
	// Started says the header came, Done that the connection closed.
	TLS *tls.Conn

	p *Peers
}

// Started tells the TLS endpoint that the connection sent its header: it
// no longer waits, and is not closed to make room for others.
func (in Inbound) Started() {
	if in.TLS != nil {
		in.p.tls.Started(in.TLS)
	}
}

// Done tells the TLS endpoint that the connection is closed.
func (in Inbound) Done() {
	if in.TLS != nil {
		in.p.tls.Done(in.TLS)
	}
}

// EventKind says what an Event reports.
type EventKind int

const (
	// ProbeEcho is the answer to a link probe (rquic.Conn.SendProbe): its
	// Peer and Payload.
	ProbeEcho EventKind = iota + 1
	// PeerDraining: Peer said it drains. It takes no new flows, and new
	// flows to it fail at once rather than try it.
	PeerDraining
	// Rejected: a peer's handshake from Remote, QUIC or TLS, was refused
	// for Err.
	Rejected
)

// Event is what the link layer tells its Upper of a peer.
type Event struct {
	Kind    EventKind
	Peer    string
	Remote  net.Addr
	Err     error
	Payload []byte
}

// fromQUIC takes what the QUIC endpoint hands up and passes it on; a peer
// lost ends its TLS flows here.
type fromQUIC struct{ p *Peers }

func (u fromQUIC) Serve(c *rquic.Conn, s *quicgo.Stream) {
	u.p.o.Upper.Serve(Inbound{Peer: c.Peer, Conn: c, Stream: s, p: u.p})
}

func (u fromQUIC) Event(e rquic.Event) {
	up := Event{Peer: e.Peer, Remote: e.Remote, Err: e.Err, Payload: e.Payload}
	switch e.Kind {
	case rquic.PeerLost:
		u.p.peerLost(e.Peer)
		return
	case rquic.ProbeEcho:
		up.Kind = ProbeEcho
	case rquic.PeerDraining:
		up.Kind = PeerDraining
	case rquic.Rejected:
		up.Kind = Rejected
	default:
		return
	}
	u.p.o.Upper.Event(up)
}

// fromTLS takes what the TLS endpoint hands up and passes it on.
type fromTLS struct{ p *Peers }

func (u fromTLS) Serve(peer string, c *tls.Conn) {
	u.p.o.Upper.Serve(Inbound{Peer: peer, TLS: c, p: u.p})
}

func (u fromTLS) Rejected(remote net.Addr, err error) {
	u.p.o.Upper.Event(Event{Kind: Rejected, Remote: remote, Err: err})
}
