package quic

import (
	"slices"
	"strings"
	"sync"
)

// MaxTunnelLinks bounds the Tunnel links a relay dials to one peer (or one
// replica of it); the flows of Tunnels past it share the link of another
// (Links.link). With the control link, a relay process holds at most
// 1 + MaxTunnelLinks connections to a peer.
const MaxTunnelLinks = 15

// Links are the connections this relay dials to its peers: a Link per
// peer, class of flows and replica, each kept up, and what they show of
// each peer's health (health.go).
type Links struct {
	e *Endpoint

	mu    sync.Mutex
	links map[linkKey]*Link
	// replicaLost holds the replicas (key: peer and replica) a link lost
	// its connection to and has not reconnected since.
	replicaLost sync.Map
	// silent holds the peers that answered no probe of their last round.
	silent sync.Map
}

// dials says whether a connection this relay dialed to peer is up.
func (ls *Links) dials(peer string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for k, l := range ls.links {
		if k.peer == peer && l.Live() != nil {
			return true
		}
	}
	return false
}

// conns is every connection this relay dialed that is up now.
func (ls *Links) conns() []*Conn {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var conns []*Conn
	for _, l := range ls.links {
		if c := l.Live(); c != nil {
			conns = append(conns, c)
		}
	}
	return conns
}

// linkKey names a link: the peer, the class of flows it carries, and for
// a peer with replicas (a sidecar relay) the replica's address.
type linkKey struct{ peer, class, replica string }

// Control is the class of a relay's control link to a peer: link probes,
// link requests and traces.
const Control = ""

// Link returns the link to a peer for a class of flows, creating it (and
// starting to dial) on first use. Each Tunnel's flows ride a link of their
// own (its class is the Tunnel's key): data a stream received but its
// relay has not yet read counts against the connection's flow-control
// window, so on a shared connection one Tunnel's stalled readers would
// stall every other Tunnel between the same two relays. A class link that
// carries no stream for idleLink closes; the control link stays up.
func (ls *Links) Link(peer, class string, addrs []string) *Link {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.link(linkKey{peer, class, ""}, addrs)
}

// Replica returns the link to one replica of a peer whose relays are
// replicas of one name (a sidecar RelayNode): each replica has links of
// its own, so the previous hop spreads flows over them and loses only a
// dead replica's flows. The replica is named by replica and dialed at
// addrs, every address its pod has (both families of a dual-stack pod,
// which may come one slice after the other: the next dial takes them).
func (ls *Links) Replica(peer, class, replica string, addrs []string) *Link {
	ls.mu.Lock()
	l := ls.link(linkKey{peer, class, replica}, addrs)
	ls.mu.Unlock()
	if !slices.Equal(l.addrsNow(), addrs) {
		l.SetAddrs(addrs)
	}
	return l
}

// link returns or starts the link of k; ls.mu is held. A Tunnel past the
// peer's (or replica's) MaxTunnelLinks shares the Tunnel link with the
// fewest streams open: the peer bounds the connections it takes from this
// relay, and one more would cost an idle link of another Tunnel.
func (ls *Links) link(k linkKey, addrs []string) *Link {
	if l := ls.links[k]; l != nil {
		return l
	}
	if k.class != Control {
		var least *Link
		n := 0
		for o, l := range ls.links {
			if o.peer == k.peer && o.replica == k.replica && o.class != Control {
				n++
				if least == nil || l.open.Load() < least.open.Load() {
					least = l
				}
			}
		}
		if n >= MaxTunnelLinks {
			return least
		}
	}
	l := newLink(ls.e, k.peer, k.class, addrs)
	l.replica = k.replica
	ls.links[k] = l
	if ls.e.ctx.Err() == nil {
		ls.e.wg.Add(1)
		go func() {
			defer ls.e.wg.Done()
			l.run()
		}()
	}
	return l
}

// forget removes a class link that closed for being idle.
func (ls *Links) forget(l *Link) {
	ls.mu.Lock()
	if k := (linkKey{l.peer, l.class, l.replica}); ls.links[k] == l {
		delete(ls.links, k)
	}
	ls.mu.Unlock()
}

// Retire ends the replica links of peer whose replica is not in keep (a
// replica that turned not-ready or left): new flows no longer take them,
// and each closes once its open flows are done.
func (ls *Links) Retire(peer string, keep []string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for k, l := range ls.links {
		if k.peer == peer && k.replica != "" && !slices.Contains(keep, k.replica) {
			l.retired.Store(true)
			delete(ls.links, k)
			ls.replicaLost.Delete(linkKey{peer, "", k.replica})
		}
	}
}

// ReplicaUp says whether one replica is reachable now: its control link
// is connected, and no link to it lost its connection since it last
// connected (a dead replica's links notice at different moments).
func (ls *Links) ReplicaUp(peer, replica string) bool {
	if _, lost := ls.replicaLost.Load(linkKey{peer, "", replica}); lost {
		return false
	}
	c := ls.replicaConn(peer, replica)
	return c != nil && !c.Draining()
}

// ReplicaDraining reports whether a replica said it drains on the
// connection up now.
func (ls *Links) ReplicaDraining(peer, replica string) bool {
	c := ls.replicaConn(peer, replica)
	return c != nil && c.Draining()
}

func (ls *Links) replicaConn(peer, replica string) *Conn {
	ls.mu.Lock()
	l := ls.links[linkKey{peer, Control, replica}]
	ls.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Live()
}

// replicaState records that a link to a replica connected or lost its connection.
func (ls *Links) replicaState(l *Link, up bool) {
	if l.replica == "" {
		return
	}
	k := linkKey{l.peer, "", l.replica}
	if up {
		ls.replicaLost.Delete(k)
	} else {
		ls.replicaLost.Store(k, true)
	}
}

// SetAddrs gives every link to a peer the peer's current endpoints.
func (ls *Links) SetAddrs(peer string, addrs []string) {
	ls.mu.Lock()
	var links []*Link
	for k, l := range ls.links {
		if k.peer == peer && k.replica == "" {
			links = append(links, l)
		}
	}
	ls.mu.Unlock()
	for _, l := range links {
		l.SetAddrs(addrs)
	}
}

// controlLinks is peer's control link, or (a peer of replicas) the control
// links of its replicas, in replica order.
func (ls *Links) controlLinks(peer string) (*Link, []*Link) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.links[linkKey{peer, Control, ""}]; l != nil {
		return l, nil
	}
	var replicas []*Link
	for k, r := range ls.links {
		if k.peer == peer && k.class == Control && k.replica != "" {
			replicas = append(replicas, r)
		}
	}
	slices.SortFunc(replicas, func(a, b *Link) int { return strings.Compare(a.replica, b.replica) })
	return nil, replicas
}

// Live returns the control connection to a peer this endpoint dials, if it
// is up now; it neither creates a link nor waits.
// A peer with replicas answers with the first of them connected.
func (ls *Links) Live(peer string) *Conn {
	l, replicas := ls.controlLinks(peer)
	if l != nil {
		return l.Live()
	}
	for _, r := range replicas {
		if c := r.Live(); c != nil {
			return c
		}
	}
	return nil
}
