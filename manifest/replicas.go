package manifest

import (
	"net"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// ReadyReplicas are the host:port endpoints of a sidecar relay: the ready
// addresses of its headless Service's EndpointSlices, at the relay port,
// sorted and without repeats. Peers dial them; the route controller reads
// some of them.
func ReadyReplicas(eps []discoveryv1.EndpointSlice, port int32) []string {
	p := strconv.Itoa(int(port))
	var out []string
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, p))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
