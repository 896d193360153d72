package nexthop

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// Connect starts the links (and warms the TLS pools) of every peer the
// manifests route this relay's flows to, and gives existing links their
// peers' current endpoints.
func (p *Peers) Connect(set *manifest.Set) {
	p.auto.forget(func(peer string) bool {
		if set.Relay(peer) != nil {
			return true
		}
		if m := p.o.Metrics; m != nil {
			for _, v := range []interface {
				DeletePartialMatch(prometheus.Labels) int
			}{m.LinkTransport, m.LinkGoodput, m.LinkFlows} {
				v.DeletePartialMatch(prometheus.Labels{"from": p.o.Name, "to": peer})
			}
		}
		return false
	})
	for _, peer := range set.NextHops(p.o.Name) {
		rn := set.Relay(peer)
		if rn.Spec.IsSidecar() {
			// A control link to every ready replica: it tells which are up.
			for _, addr := range rn.Spec.Endpoints {
				p.quic.Replica(peer, rquic.Control, addr)
			}
			p.quic.Retire(peer, rn.Spec.Endpoints)
			p.tls.Retire(peer, rn.Spec.Endpoints)
			continue
		}
		p.quic.Link(peer, rquic.Control, rn.Spec.Endpoints)
		p.quic.SetAddrs(peer, rn.Spec.Endpoints)
	}
	for _, c := range set.Chains {
		if c.Spec.Transport == v1alpha1.TransportQUIC {
			continue
		}
		var next []string
		route := manifest.Route(c)
		if i := slices.Index(route, p.o.Name); i >= 0 && i+1 < len(route) {
			next = append(next, route[i+1])
		}
		if c.Spec.Mode.Routed() {
			next = append(next, manifest.NextHopsOf(c, p.o.Name)...)
		}
		for _, peer := range next {
			if rn := set.Relay(peer); rn.Spec.IsSidecar() {
				for _, addr := range rn.Spec.Endpoints {
					p.tls.Replica(peer, addr) // warm them now
				}
			} else {
				p.tls.Pool(peer, rn.Spec.Endpoints) // warm it now
			}
		}
	}
}
