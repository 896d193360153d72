package manifest

import (
	"net"
	"slices"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Replica is one ready replica of a sidecar relay: where it is dialed, its
// pod's addresses of every family at the relay port (a dual-stack pod's
// two, dialed happy-eyeballs style as a relay's published endpoints are).
type Replica struct {
	// Name tells it from the others: its pod's name where the
	// EndpointSlices say (targetRef), else its first endpoint.
	Name      string
	Endpoints []string
}

// Replicas are the ready replicas of a sidecar relay, read from its
// headless Service's EndpointSlices, sorted by name. A dual-stack Service
// has a slice per family, each naming the pod behind an address: the
// addresses of one pod are one replica, so a pod is neither counted nor
// spread to twice. So are names that share an address (one relay listens
// there, whatever the slices say: a stale entry of the pod that had the
// address before, or one that names no pod); their replica keeps the
// first of their pod names.
func Replicas(eps []discoveryv1.EndpointSlice, port int32) []Replica {
	p := strconv.Itoa(int(port))
	// Names joined by a shared address have one root (join).
	root := map[string]string{}
	find := func(n string) string {
		for root[n] != n {
			root[n] = root[root[n]]
			n = root[n]
		}
		return n
	}
	// A pod's name goes before an address's (they hold a ':'), and a
	// smaller before a larger.
	before := func(a, b string) bool {
		if pa, pb := !strings.Contains(a, ":"), !strings.Contains(b, ":"); pa != pb {
			return pa
		}
		return a < b
	}
	join := func(a, b string) {
		if a, b = find(a), find(b); a == b {
			return
		}
		if before(b, a) {
			a, b = b, a
		}
		root[b] = a
	}
	owner := map[string]string{} // endpoint: the first name it came under
	named := map[string][]string{}
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				ep := net.JoinHostPort(a, p)
				name := ep
				if r := e.TargetRef; r != nil && r.Name != "" {
					name = r.Name
				}
				if _, ok := root[name]; !ok {
					root[name] = name
				}
				if o, ok := owner[ep]; ok {
					join(o, name)
				} else {
					owner[ep] = name
				}
				named[name] = append(named[name], ep)
			}
		}
	}
	byRoot := map[string]*Replica{}
	for name, eps := range named {
		r := find(name)
		if byRoot[r] == nil {
			byRoot[r] = &Replica{Name: r}
		}
		byRoot[r].Endpoints = append(byRoot[r].Endpoints, eps...)
	}
	replicas := make([]Replica, 0, len(byRoot))
	for _, r := range byRoot {
		slices.Sort(r.Endpoints)
		r.Endpoints = slices.Compact(r.Endpoints)
		replicas = append(replicas, *r)
	}
	slices.SortFunc(replicas, func(a, b Replica) int { return strings.Compare(a.Name, b.Name) })
	return replicas
}

// ReadyReplicas are every endpoint of Replicas, sorted and without repeats:
// a sidecar relay's endpoints, as a relay's published ones are every
// address of every pod.
func ReadyReplicas(eps []discoveryv1.EndpointSlice, port int32) []string {
	return replicaEndpoints(Replicas(eps, port))
}

func replicaEndpoints(rs []Replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Endpoints...)
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
