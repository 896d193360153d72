package nexthop

import (
	"context"
	"sync"

	"github.com/hoplink/hoplink/relay/hop"
)

// tlsShare is what maxTLSFlowsPerTunnel counts: a Tunnel's flows to a
// peer; or, interactive, maxTLSInteractivePerTunnel.
type tlsShare struct {
	peer, tunnel string
	interactive  bool
}

func (k tlsShare) max() int {
	if k.interactive {
		return maxTLSInteractivePerTunnel
	}
	return maxTLSFlowsPerTunnel
}

// tlsShares counts the TLS flows open under auto, by share, and the
// interactive ones of every share (maxTLSInteractive).
type tlsShares struct {
	mu          sync.Mutex
	flows       map[tlsShare]int
	interactive int
}

// take takes a slot of the Tunnel's share of TLS flows to peer, or says
// there is none left.
func (s *tlsShares) take(k tlsShare) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flows[k] >= k.max() || (k.interactive && s.interactive >= maxTLSInteractive) {
		return false
	}
	if s.flows == nil {
		s.flows = map[tlsShare]int{}
	}
	s.flows[k]++
	if k.interactive {
		s.interactive++
	}
	return true
}

func (s *tlsShares) give(k tlsShare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k.interactive && s.flows[k] > 0 {
		s.interactive--
	}
	if s.flows[k] <= 1 {
		delete(s.flows, k)
		return
	}
	s.flows[k]--
}

// openTLSShared is openTLS within the share of TLS flows h's Tunnel has to
// the peer (maxTLSFlowsPerTunnel, or for interactive flows
// maxTLSInteractivePerTunnel, whose flows take a spare or a handshake that
// can start now, and whose sockets keep interactiveBuffer): shared
// is false, and nothing opened, when the share is taken; the flow gives its
// slot back when it ends.
func (hs *Hops) openTLSShared(ctx context.Context, h *hop.Header, spareOnly, interactive bool) (out *Hop, shared bool, err error) {
	k := tlsShare{h.Route[0], h.Tunnel, interactive}
	if !hs.shares.take(k) {
		return nil, false, nil
	}
	release := sync.OnceFunc(func() { hs.shares.give(k) })
	o := tlsOpen{spareOnly: spareOnly, ended: release}
	if interactive {
		// A spare, or a handshake now if one can start at once: in a
		// burst the rest ride QUIC rather than queue behind handshakes.
		o.quick, o.buffer = true, interactiveBuffer
	}
	if out, err = hs.openTLS(ctx, h, o); out == nil {
		release()
	}
	return out, true, err
}
