package relay

import (
	"net/netip"
	"sync"

	"github.com/hoplink/hoplink/srcaddr"
)

// quota shares a relay's flow tokens, so that no Tunnel, and no client,
// can take them all: at most max flows at once, at most perTunnel of one
// Tunnel's (in every role: a middle or exit relay carries other entries'
// Tunnels), and at an entry at most perSource of one Tunnel's from one
// client host (an IPv4 address or an IPv6 /64: one host holds a whole /64,
// and would otherwise be a new source at each address it picks).
type quota struct {
	max, perTunnel, perSource int

	mu      sync.Mutex
	total   int
	tunnels map[string]int
	sources map[source]int
}

type source struct {
	tunnel string
	host   netip.Prefix // srcaddr.Key
}

// Reasons a flow is refused: the reason label of hoplink_flow_errors_total.
const (
	flowLimit   = "flow_limit"
	tunnelLimit = "tunnel_limit"
	sourceLimit = "source_limit"
	// refusedDraining: the relay drains (shuts down) and takes no new flow.
	refusedDraining = "draining"
)

// Shares of the relay's flows, when Config leaves them out: a quarter for
// one Tunnel, and a sixteenth of that (at least 64) for one client host.
func defaultShares(flows int) (perTunnel, perSource int) {
	perTunnel = max(flows/4, 1)
	return perTunnel, min(perTunnel, max(perTunnel/16, 64))
}

func newQuota(flows, perTunnel, perSource int) *quota {
	return &quota{max: flows, perTunnel: perTunnel, perSource: perSource, tunnels: map[string]int{}, sources: map[source]int{}}
}

// take takes a token for a flow of tunnel from host (the zero Addr past
// the entry), or says which limit refused it. tunnelMax, when above zero,
// is the Tunnel's own bound (spec.limits.maxFlows).
func (q *quota) take(tunnel string, host netip.Addr, tunnelMax int) (reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	src := source{tunnel, srcaddr.Key(host)}
	perTunnel := q.perTunnel
	if tunnelMax > 0 {
		perTunnel = min(perTunnel, tunnelMax)
	}
	switch {
	case q.total >= q.max:
		return flowLimit
	case q.tunnels[tunnel] >= perTunnel:
		return tunnelLimit
	case host.IsValid() && q.sources[src] >= q.perSource:
		return sourceLimit
	}
	q.total++
	q.tunnels[tunnel]++
	if host.IsValid() {
		q.sources[src]++
	}
	return ""
}

// give gives back what take took.
func (q *quota) give(tunnel string, host netip.Addr) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.total--
	if q.tunnels[tunnel]--; q.tunnels[tunnel] <= 0 {
		delete(q.tunnels, tunnel)
	}
	if host.IsValid() {
		src := source{tunnel, srcaddr.Key(host)}
		if q.sources[src]--; q.sources[src] <= 0 {
			delete(q.sources, src)
		}
	}
}

// inUse is how many tokens are taken.
func (q *quota) inUse() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total
}
