package manifest

import (
	"fmt"
	"strings"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// FromObjects builds a Set from objects read from the Kubernetes API. A
// cluster holds what many users applied, so one bad object must not stop a
// relay: unlike Load, FromObjects leaves out every object with a problem, and
// then whatever depended on it (a Tunnel of a Chain that was left out), and
// returns the problems for the caller to report. The objects are copied.
func FromObjects(relays []v1alpha1.RelayNode, chains []v1alpha1.Chain, tunnels []v1alpha1.Tunnel) (*Set, []error) {
	rs := make([]*v1alpha1.RelayNode, len(relays))
	for i := range relays {
		rs[i] = relays[i].DeepCopy()
	}
	cs := make([]*v1alpha1.Chain, len(chains))
	for i := range chains {
		cs[i] = chains[i].DeepCopy()
	}
	ts := make([]*v1alpha1.Tunnel, len(tunnels))
	for i := range tunnels {
		ts[i] = tunnels[i].DeepCopy()
	}
	var reported []error
	// Each round drops at least one object or ends, so it is bounded.
	for range len(rs) + len(cs) + len(ts) + 1 {
		s := newSet()
		s.endpointsMayLack = true
		for _, o := range rs {
			s.add(apiSource(), o)
		}
		for _, o := range cs {
			s.add(apiSource(), o)
		}
		for _, o := range ts {
			s.add(apiSource(), o)
		}
		p := s.validate()
		if len(p.errs) == 0 {
			return s, reported
		}
		reported = append(reported, p.errs...)
		rs = keep(rs, func(o *v1alpha1.RelayNode) bool { return !p.objs["RelayNode "+o.Name] })
		cs = keep(cs, func(o *v1alpha1.Chain) bool { return !p.objs["Chain "+Key(o.Namespace, o.Name)] })
		ts = keep(ts, func(o *v1alpha1.Tunnel) bool { return !p.objs["Tunnel "+Key(o.Namespace, o.Name)] })
	}
	return newSet(), reported
}

func apiSource() Source { return Source{File: "cluster", Doc: 1} }

func keep[T any](objs []T, ok func(T) bool) []T {
	out := objs[:0]
	for _, o := range objs {
		if ok(o) {
			out = append(out, o)
		}
	}
	return out
}

// ClusterOnly lists, for each RelayNode that sets them, the fields that
// only a cluster's operator acts on (how it runs relay pods), which local
// mode and standalone relays leave alone: "RelayNode x: spec.image, ...".
func (s *Set) ClusterOnly() []string {
	var out []string
	for _, rn := range s.Relays {
		sp := rn.Spec
		var f []string
		for _, c := range []struct {
			set   bool
			field string
		}{
			{sp.External, "spec.external"}, {sp.HostNetwork != nil, "spec.hostNetwork"},
			{len(sp.NodeSelector) > 0, "spec.nodeSelector"}, {len(sp.Tolerations) > 0, "spec.tolerations"},
			{sp.Resources != nil, "spec.resources"}, {sp.Image != "", "spec.image"},
			{sp.TUN, "spec.tun"}, {sp.Sidecar != nil, "spec.sidecar"},
		} {
			if c.set {
				f = append(f, c.field)
			}
		}
		if len(f) > 0 {
			out = append(out, fmt.Sprintf("RelayNode %s: %s", rn.Name, strings.Join(f, ", ")))
		}
	}
	return out
}
