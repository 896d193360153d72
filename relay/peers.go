package relay

import (
	"slices"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// peersOf is what this relay's link layer knows of the relays of set,
// read from the manifests: every relay may connect, each with its bound
// of connections; the next hops of this relay's routes keep their links
// up, and those a chain may reach over TLS (tls or auto) their pools warm.
func peersOf(set *manifest.Set, self string) []nexthop.Peer {
	next := map[string]bool{}
	for _, peer := range set.NextHops(self) {
		next[peer] = true
	}
	warm := map[string]bool{}
	for _, c := range set.Chains {
		if c.Spec.Transport == v1alpha1.TransportQUIC {
			continue
		}
		route := manifest.Route(c)
		if i := slices.Index(route, self); i >= 0 && i+1 < len(route) {
			warm[route[i+1]] = true
		}
		if c.Spec.Mode.Routed() {
			for _, peer := range manifest.NextHopsOf(c, self) {
				warm[peer] = true
			}
		}
	}
	out := make([]nexthop.Peer, 0, len(set.Relays))
	for _, rn := range set.Relays {
		peer := nexthop.Peer{Name: rn.Name, Endpoints: rn.Spec.Endpoints, Replicas: rn.Spec.IsSidecar(),
			MaxConns: maxConns(set, self, rn.Name), NextHop: next[rn.Name], Warm: warm[rn.Name]}
		if peer.Replicas {
			for _, r := range set.ReplicasOf(rn.Name) {
				peer.Pods = append(peer.Pods, nexthop.Replica{Name: r.Name, Endpoints: r.Endpoints})
			}
		}
		out = append(out, peer)
	}
	return out
}

// maxConns is how many QUIC connections peer may hold to relay self (the
// link layer admits that many). One relay process dials a control link and a
// link per Tunnel with flows, at most nexthop.MaxTunnelLinks of them, so it
// needs one plus the Tunnels whose flows the manifests let it send to self,
// so capped. Several processes may run under one name (a DaemonSet's
// pods, a sidecar's replicas), as many as the manifests know of; and one
// more process's worth: a relay that restarted reconnects before its old
// connections are gone, and a pod may start before its status counts it.
func maxConns(set *manifest.Set, self, peer string) int {
	rn := set.Relay(peer)
	if rn == nil {
		return 1 // not a relay of the manifests: refused anyway
	}
	perProcess := 1 + min(hopTunnels(set, peer, self), nexthop.MaxTunnelLinks)
	return perProcess * (processes(rn) + 1)
}

// hopTunnels counts the Tunnels whose flows may go from relay prev to
// relay self: a static route that has the hop, a routed chain that lets
// prev continue to self.
func hopTunnels(set *manifest.Set, prev, self string) int {
	n := 0
	for _, t := range set.Tunnels {
		c := set.ChainOf(t)
		if c == nil {
			continue
		}
		r := manifest.Route(c)
		i := slices.Index(r, prev)
		if (i >= 0 && i+1 < len(r) && r[i+1] == self) ||
			(c.Spec.Mode.Routed() && slices.Contains(manifest.NextHopsOf(c, prev), self)) {
			n++
		}
	}
	return n
}

// processes is how many relay processes the manifests say run under rn's
// name: the pods its status counts, its endpoints (one per pod or replica
// where a cluster publishes them), at least one.
func processes(rn *v1alpha1.RelayNode) int {
	st := rn.Status
	return max(1, int(st.Desired), int(st.Ready), int(st.Injected), len(rn.Spec.Endpoints), len(st.Endpoints))
}
