package relay

import (
	"net/netip"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// sourceNotAllowed: a client outside the Tunnel's spec.listen.allowedSources
// (the reason label of hoplink_flow_errors_total and of
// hoplink_udp_dropped_packets_total).
const sourceNotAllowed = "source_not_allowed"

// allowedSources says whether a client host may use a Tunnel's entry. The
// manifests were validated, so a list that does not parse here cannot
// occur; were it to, the entry takes no one rather than everyone.
func allowedSources(t *v1alpha1.Tunnel) func(netip.Addr) bool {
	nets, err := manifest.AllowedSources(t.Spec.Listen)
	switch {
	case err != nil:
		return func(netip.Addr) bool { return false }
	case nets == nil:
		return func(netip.Addr) bool { return true }
	}
	return func(a netip.Addr) bool {
		a = a.Unmap()
		for _, p := range nets {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
}
