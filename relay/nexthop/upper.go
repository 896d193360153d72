package nexthop

import (
	"net"

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
	// Refused: a hop Peer opened was refused before its header was read,
	// for Reason (header_limit, bad_header) and Err.
	Refused
)

// Event is what the link layer tells its Upper of a peer.
type Event struct {
	Kind    EventKind
	Peer    string
	Remote  net.Addr
	Reason  string
	Err     error
	Payload []byte
}

// fromQUIC takes what the QUIC endpoint hands up and passes it on; a peer
// lost ends its TLS flows here.
type fromQUIC struct{ p *Peers }

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
	u.p.up.Event(up)
}

// fromTLS takes what the TLS endpoint hands up and passes it on.
type fromTLS struct{ p *Peers }

func (u fromTLS) Rejected(remote net.Addr, err error) {
	u.p.up.Event(Event{Kind: Rejected, Remote: remote, Err: err})
}

// refused tells the Upper of a hop refused before its header was read.
func (p *Peers) refused(peer string, remote net.Addr, reason string, err error) {
	p.up.Event(Event{Kind: Refused, Peer: peer, Remote: remote, Reason: reason, Err: err})
}
