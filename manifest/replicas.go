package manifest

import (
	"net"
	"slices"
	"strconv"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
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

// Dialed is a copy of rn, read from a cluster, whose spec.endpoints are
// where peers dial it: a sidecar RelayNode's ready replicas (eps: the
// EndpointSlices of its headless Service), another's published endpoints
// when its status has any, else its own.
func Dialed(rn *v1alpha1.RelayNode, eps []discoveryv1.EndpointSlice) v1alpha1.RelayNode {
	out := *rn.DeepCopy()
	switch {
	case rn.Spec.IsSidecar():
		out.Spec.Endpoints = ReadyReplicas(eps, rn.Spec.RelayPort())
	case len(rn.Status.Endpoints) > 0:
		out.Spec.Endpoints = slices.Clone(rn.Status.Endpoints)
	}
	return out
}
