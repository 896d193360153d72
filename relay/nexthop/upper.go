package nexthop

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
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

// Inbound is what a peer opened: its header, read here (bounded in size
// and time), and the hop it came on. The Upper admits it or refuses it
// (Hop.Refuse).
type Inbound struct {
	Header hop.Header
	Hop    *Hop
}

// HeaderTimeout bounds how long a peer may take to send a hop's header.
const HeaderTimeout = 10 * time.Second

// MaxPendingHeaders bounds the streams one QUIC connection may have
// waiting for their header: a stream holds no flow token until its header
// is read, so a peer sending half headers would otherwise hold a goroutine
// and buffers per stream for HeaderTimeout, without bound. It is a
// connection's, not a peer's: a peer's connections are its Tunnels' links,
// and one of them full of half headers must not refuse the streams of the
// others. The connections a peer may hold are bounded too
// (rquic.Options.MaxConns); TLS bounds its own (tlslink's waiting).
const MaxPendingHeaders = 256

// pending counts the streams of each QUIC connection waiting for their
// header.
type pending struct {
	mu sync.Mutex
	n  map[*rquic.Conn]int
}

// await takes a slot for a stream of c to wait for its header in.
func (p *pending) await(c *rquic.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[c] >= MaxPendingHeaders {
		return false
	}
	if p.n == nil {
		p.n = map[*rquic.Conn]int{}
	}
	p.n[c]++
	return true
}

func (p *pending) done(c *rquic.Conn) {
	p.mu.Lock()
	if p.n[c]--; p.n[c] <= 0 {
		delete(p.n, c)
	}
	p.mu.Unlock()
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

// Serve reads the header of a stream a peer opened and hands the hop up.
func (u fromQUIC) Serve(c *rquic.Conn, s *quicgo.Stream) {
	p := u.p
	if !p.headers.await(c) {
		p.refused(c.Peer, c.RemoteAddr(), "header_limit", errors.New("too many streams waiting for their header"))
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Now().Add(HeaderTimeout))
	h, err := hop.Read(s)
	p.headers.done(c)
	if _, _, reset := flow.ResetCode(err); reset {
		// The flow ended before its header arrived (a client that gave up
		// at once): nothing hostile, nothing to count.
		flow.Reset(s, hop.CodeReset)
		return
	}
	if err != nil {
		p.refused(c.Peer, c.RemoteAddr(), "bad_header", err)
		flow.Reset(s, hop.CodeRejected)
		return
	}
	s.SetReadDeadline(time.Time{})
	end := flow.Stream(s)
	if h.Kind == hop.KindTCP {
		// A TCP flow's first writes wait for the connection's window, and
		// the connection stays while it runs when its peer drains.
		end = flow.HeldStream(c.Conn, s, nil)
		defer c.Hold()()
	}
	p.o.Upper.Serve(Inbound{Header: h, Hop: quicHop(c, s, end)})
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

// Serve reads the header of the flow a peer sent on a TLS connection (the
// endpoint set the read deadline that bounds it) and hands the hop up.
func (u fromTLS) Serve(peer string, c *tls.Conn) {
	p := u.p
	end := flow.TLS(c, func() { p.tls.Done(c) })
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		end.Abort() // a spare the peer retired unused, or a peer gone
		return
	}
	h, err := hop.Read(io.MultiReader(bytes.NewReader(first[:]), c))
	if err != nil {
		p.refused(peer, c.RemoteAddr(), "bad_header", err)
		end.Abort()
		return
	}
	p.tls.Started(c)
	c.SetReadDeadline(time.Time{})
	p.o.Upper.Serve(Inbound{Header: h, Hop: tlsHop(peer, c.RemoteAddr(), end)})
}

func (u fromTLS) Rejected(remote net.Addr, err error) {
	u.p.o.Upper.Event(Event{Kind: Rejected, Remote: remote, Err: err})
}

// refused tells the Upper of a hop refused before its header was read.
func (p *Peers) refused(peer string, remote net.Addr, reason string, err error) {
	p.o.Upper.Event(Event{Kind: Refused, Peer: peer, Remote: remote, Reason: reason, Err: err})
}
