package quic

import (
	"net"

	quicgo "github.com/quic-go/quic-go"
)

// Upper is the layer above an Endpoint, its one way in: the streams peers
// open, and what the endpoint learns of its peers.
type Upper interface {
	// Serve serves a stream a peer opened, on a goroutine of its own; it
	// owns the stream.
	Serve(c *Conn, s *quicgo.Stream)
	// Event hears what the endpoint learned of a peer. It runs on the
	// endpoint's goroutines (a connection's datagrams, a link's dials), so
	// it must not block.
	Event(e Event)
}

// EventKind says what an Event reports.
type EventKind int

const (
	// ProbeEcho is the answer to a link probe sent on a connection this
	// endpoint dialed (Conn.SendProbe): Peer and the probe's Payload.
	ProbeEcho EventKind = iota + 1
	// PeerLost: Peer's control connection timed out; it stopped answering.
	PeerLost
	// PeerDraining: Peer said, on its link, that it drains (see Drain).
	PeerDraining
	// Rejected: a peer's handshake from Remote was refused, for Err.
	Rejected
)

// Event is what an Endpoint tells its Upper of its peers.
type Event struct {
	Kind    EventKind
	Peer    string
	Remote  net.Addr
	Err     error
	Payload []byte
}

// event tells the Upper, if there is one.
func (e *Endpoint) event(ev Event) {
	if e.opts.Upper != nil {
		e.opts.Upper.Event(ev)
	}
}
