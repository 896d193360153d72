package nexthop

import (
	"github.com/prometheus/client_golang/prometheus"

	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Peer is what the link layer knows of another relay. The relay above
// reads it from its manifests and hands the whole set down whenever they
// change (SetPeers): nothing here reads a manifest.
type Peer struct {
	Name string
	// Endpoints are where it is dialed; with Replicas, every replica's.
	Endpoints []string
	// Replicas: its relays are replicas under one name (a sidecar
	// RelayNode), each reached over links and pools of its own.
	Replicas bool
	// Pods are its replicas, each dialed at every endpoint of its own
	// (a dual-stack pod's two families, happy-eyeballs style); none
	// given, each of Endpoints is one.
	Pods []Replica
	// MaxConns bounds the QUIC connections it may hold to this relay.
	MaxConns int
	// NextHop: this relay sends it flows, so its control link stays up.
	NextHop bool
	// Warm: its flows may ride TLS, so its pools are kept ready.
	Warm bool
}

// Replica is one replica of a peer with Replicas.
type Replica struct {
	// Name tells it from the peer's other replicas: its pod's name.
	Name string
	// Endpoints are where it is dialed.
	Endpoints []string
}

// replicas are the replicas of a peer with Replicas: its Pods, else each
// of its endpoints one.
func (peer Peer) replicas() []Replica {
	if len(peer.Pods) > 0 {
		return peer.Pods
	}
	out := make([]Replica, len(peer.Endpoints))
	for i, ep := range peer.Endpoints {
		out[i] = Replica{Name: ep, Endpoints: []string{ep}}
	}
	return out
}

func replicaNames(rs []Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// SetPeers replaces what the link layer knows of other relays: only they
// may connect; the control links of next hops start (to every replica of
// one with replicas, while those that left are retired) and existing
// links take their current endpoints; warm peers' TLS pools fill. Before
// Listen it only records them, and Listen starts their links.
func (p *Peers) SetPeers(peers []Peer) {
	m := make(map[string]Peer, len(peers))
	for _, peer := range peers {
		m[peer.Name] = peer
	}
	p.mu.Lock()
	p.peers = m
	p.order = peers
	p.mu.Unlock()
	if p.quic == nil {
		return
	}
	conns, names := admission(peers)
	p.quic.SetPeers(conns)
	p.tls.SetPeers(names)
	p.start(peers)
}

// peer is what is known of a relay, if it is one.
func (p *Peers) peer(name string) (Peer, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	peer, ok := p.peers[name]
	return peer, ok
}

// admission is who may connect: over QUIC with the connections each may
// hold, and over TLS.
func admission(peers []Peer) (conns map[string]int, names []string) {
	conns = make(map[string]int, len(peers))
	for _, peer := range peers {
		conns[peer.Name] = peer.MaxConns
		names = append(names, peer.Name)
	}
	return conns, names
}

// start starts the links and pools of peers, and forgets what the
// transport chooser knew of relays no longer among them.
func (p *Peers) start(peers []Peer) {
	p.auto.forget(func(name string) bool {
		if _, ok := p.peer(name); ok {
			return true
		}
		if m := p.o.Metrics; m != nil {
			for _, v := range []interface {
				DeletePartialMatch(prometheus.Labels) int
			}{m.LinkTransport, m.LinkGoodput, m.LinkFlows} {
				v.DeletePartialMatch(prometheus.Labels{"from": p.o.Name, "to": name})
			}
		}
		return false
	})
	for _, peer := range peers {
		switch {
		case !peer.NextHop:
		case peer.Replicas:
			// A control link to every ready replica: it tells which are up.
			rs := peer.replicas()
			for _, r := range rs {
				p.links.Replica(peer.Name, rquic.Control, r.Name, r.Endpoints)
			}
			p.links.Retire(peer.Name, replicaNames(rs))
			p.pools.Retire(peer.Name, replicaNames(rs))
		default:
			p.links.Link(peer.Name, rquic.Control, peer.Endpoints)
			p.links.SetAddrs(peer.Name, peer.Endpoints)
		}
	}
	for _, peer := range peers {
		switch {
		case !peer.Warm:
		case peer.Replicas:
			for _, r := range peer.replicas() {
				p.pools.Replica(peer.Name, r.Name, r.Endpoints) // warm them now
			}
		default:
			p.pools.Pool(peer.Name, peer.Endpoints) // warm it now
		}
	}
}
