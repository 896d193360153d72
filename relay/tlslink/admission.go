package tlslink

import (
	crand "crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/hoplink/hoplink/pki"
)

// SetPeers replaces the relays that may connect (Options.Peers).
// Connections already up stay until Recheck.
func (e *Endpoint) SetPeers(peers []string) {
	m := make(map[string]bool, len(peers))
	for _, p := range peers {
		m[p] = true
	}
	e.mu.Lock()
	e.peers = m
	e.mu.Unlock()
}

// known says whether a relay of that name may connect.
func (e *Endpoint) known(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peers[name]
}

// Recheck closes every connection carrying a flow whose peer no longer
// holds: its certificate expired, or (full) it is no longer among Peers.
// With full, new handshakes also check peers against the CAs trusted
// now (no session made before resumes). It returns how many it closed.
func (e *Endpoint) Recheck(full bool) int {
	e.mu.Lock()
	conns := make([]*tls.Conn, 0, len(e.active))
	for c := range e.active {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	if full && e.pools.retrust() {
		// Sessions resume without a certificate check: none made under
		// the old trust may.
		var key [32]byte
		crand.Read(key[:])
		e.serverConf.SetSessionTicketKeys([][32]byte{key})
	}
	n := 0
	for _, c := range conns {
		if err := e.peerHolds(c.ConnectionState(), full); err != nil {
			peer, _ := pki.PeerName(c.ConnectionState())
			e.opts.Log.Warn("closing the connection to a peer that no longer holds", "peer", peer, "transport", "tls", "err", err)
			c.NetConn().Close()
			n++
		}
	}
	return n
}

// ClosePeer closes every connection carrying a flow to or from peer, and
// returns how many: the peer stopped answering, and TCP would keep its
// flows hanging for as long as its kernel still acknowledges (a stopped
// process) or its retransmissions last (a lost host).
func (e *Endpoint) ClosePeer(peer string) int {
	e.mu.Lock()
	var conns []*tls.Conn
	for c := range e.active {
		if name, err := pki.PeerName(c.ConnectionState()); err == nil && name == peer {
			conns = append(conns, c)
		}
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.NetConn().Close()
	}
	return len(conns)
}

func (e *Endpoint) peerHolds(st tls.ConnectionState, full bool) error {
	if len(st.PeerCertificates) == 0 {
		return nil // not yet handshaken
	}
	if leaf := st.PeerCertificates[0]; time.Now().After(leaf.NotAfter) {
		return fmt.Errorf("its certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if !full {
		return nil
	}
	if peer, err := pki.PeerName(st); err != nil || !e.known(peer) {
		return errors.New("the manifests no longer name it")
	}
	return nil
}
