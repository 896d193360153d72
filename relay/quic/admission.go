package quic

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// DefaultMaxConns is the connections a peer may hold when Options.Peers
// says nothing: as many as one relay process dials, twice over, since a
// relay that restarted reconnects before its old connections are gone.
const DefaultMaxConns = 2 * (1 + MaxTunnelLinks)

// SetPeers replaces the relays that may connect and the connections each
// may hold (Options.Peers). Connections already up stay until Recheck.
func (e *Endpoint) SetPeers(peers map[string]int) {
	e.mu.Lock()
	e.peers = peers
	e.mu.Unlock()
}

// known says whether a relay of that name may connect.
func (e *Endpoint) known(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.peers[name]
	return ok
}

// bound closes connections of c's peer (those it dialed to this relay)
// past the peer's bound, c just accepted among them, and reports whether
// c itself closed. Each connection may make this relay buffer up to its
// flow-control window, so connections without bound were memory without
// bound. The idlest close first (idleness.closesBefore), and never one
// serving a stream: c serves none yet, so it closes rather than a busy
// one, and a bound that shrank (a Tunnel removed) leaves flows to finish.
// A connection the peer used as its link closes only once every one the
// peer made and never used is gone.
func (e *Endpoint) bound(c *Conn) bool {
	limit := DefaultMaxConns
	e.mu.Lock()
	if n := e.peers[c.Peer]; n > 0 {
		limit = n
	}
	e.mu.Unlock()
	var peers []idleness
	for _, o := range e.accepted.list() {
		if o.Peer == c.Peer && o.Context().Err() == nil {
			peers = append(peers, o.idleness())
		}
	}
	if len(peers) <= limit {
		return false
	}
	slices.SortFunc(peers, idleness.closesBefore)
	self := false
	for _, v := range peers[:len(peers)-limit] {
		if v.busy {
			break
		}
		e.opts.Metrics.ConnsEvicted.WithLabelValues(e.opts.Name, c.Peer).Inc()
		e.warn.Warn("peer holds too many connections: the idlest closes", "peer", c.Peer, "limit", limit, "remote", v.c.RemoteAddr())
		v.c.CloseWithError(0, "too many connections from this relay")
		self = self || v.c == c
	}
	return self
}

// Recheck closes every connection whose peer no longer holds: its
// certificate expired, or (full) it is no longer among Peers. Flows on
// such a connection end. It returns how many it closed.
func (e *Endpoint) Recheck(full bool) int {
	n := 0
	now := time.Now()
	for _, c := range e.allConns() {
		var err error
		st := c.ConnectionState().TLS
		switch {
		case len(st.PeerCertificates) > 0 && now.After(st.PeerCertificates[0].NotAfter):
			err = fmt.Errorf("its certificate expired at %s", st.PeerCertificates[0].NotAfter.UTC().Format(time.RFC3339))
		case full && !e.known(c.Peer):
			err = errors.New("the manifests no longer name it")
		}
		if err != nil {
			e.opts.Log.Warn("closing the connection to a peer that no longer holds", "peer", c.Peer, "transport", "quic", "err", err)
			c.CloseWithError(0, "peer no longer trusted")
			n++
		}
	}
	return n
}
