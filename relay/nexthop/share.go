package nexthop

import (
	"context"
	"sync"

	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
)

// tlsShare is what maxTLSFlowsPerTunnel counts: a Tunnel's flows to a peer.
type tlsShare struct{ peer, tunnel string }

// takeTLS takes a slot of the Tunnel's share of TLS flows to peer, or
// says there is none left.
func (p *Peers) takeTLS(k tlsShare) bool {
	p.tlsMu.Lock()
	defer p.tlsMu.Unlock()
	if p.tlsFlows[k] >= maxTLSFlowsPerTunnel {
		return false
	}
	if p.tlsFlows == nil {
		p.tlsFlows = map[tlsShare]int{}
	}
	p.tlsFlows[k]++
	return true
}

func (p *Peers) giveTLS(k tlsShare) {
	p.tlsMu.Lock()
	defer p.tlsMu.Unlock()
	if p.tlsFlows[k] <= 1 {
		delete(p.tlsFlows, k)
		return
	}
	p.tlsFlows[k]--
}

// openTLSShared is openTLS within the share of TLS flows h's Tunnel has to
// the peer (maxTLSFlowsPerTunnel): shared is false, and nothing opened,
// when the share is taken; the flow gives its slot back when it ends.
func (p *Peers) openTLSShared(ctx context.Context, h *hop.Header, spareOnly bool) (out flow.End, shared bool, err error) {
	k := tlsShare{h.Route[0], h.Tunnel}
	if !p.takeTLS(k) {
		return nil, false, nil
	}
	release := sync.OnceFunc(func() { p.giveTLS(k) })
	if out, err = p.openTLS(ctx, h, spareOnly, release); out == nil {
		release()
	}
	return out, true, err
}
