package nexthop

import (
	"github.com/hoplink/hoplink/api/v1alpha1"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Draining reports whether a peer (every replica of a sidecar peer) said
// it drains.
func (p *Peers) Draining(peer string) bool {
	r, ok := p.peer(peer)
	if !ok || !r.Replicas {
		return p.quic.PeerDraining(peer)
	}
	rs := r.replicas()
	for _, a := range rs {
		if !p.links.ReplicaDraining(peer, a.Name) {
			return false
		}
	}
	return len(rs) > 0
}

// LinkTransport is the transport bulk flows of auto chains take to peer
// now and why; "" before this relay chose one.
func (p *Peers) LinkTransport(peer string) (v1alpha1.Transport, string) {
	return p.auto.current(peer)
}

// Answering records whether peer answered the last round of link probes
// (see rquic.Links.Answering).
func (p *Peers) Answering(peer string, ok bool) { p.links.Answering(peer, ok) }

// peerLost ends the TLS flows of a peer whose QUIC control connection
// timed out: it stopped answering (a host lost, a process hung). QUIC's
// idle timeout ended its QUIC flows; TCP would keep TLS flows hanging for
// as long as its kernel acknowledges or its retransmissions last.
func (p *Peers) peerLost(peer string) {
	if n := p.tls.ClosePeer(peer); n > 0 && p.o.Log != nil {
		p.o.Log.Warn("peer stopped answering: its TLS flows end", "peer", peer, "flows", n)
	}
}

// Down reports whether this relay's link to peer is known down now: it
// answered no probe of the last round, or its connection timed out or a
// dial failed and none is up since (see rquic.Links.PeerDown).
func (p *Peers) Down(peer string) bool { return p.links.PeerDown(peer) }

// Lost reports whether this relay's connection to peer is known lost (see
// rquic.Links.PeerLost): a probe round unanswered over a live connection
// is not enough.
func (p *Peers) Lost(peer string) bool { return p.links.PeerLost(peer) }

// Live returns the connection to a peer if it is up now, without waiting.
func (p *Peers) Live(peer string) *rquic.Conn { return p.links.Live(peer) }

// Up says whether the link to peer carries new flows now: connected, not
// counted down, not draining.
func (p *Peers) Up(peer string) bool {
	return p.links.Live(peer) != nil && !p.Down(peer) && !p.Draining(peer)
}
