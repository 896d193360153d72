package manifest

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

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

// Objects is the inverse of FromObjects: the Set's objects, copied, for a
// caller that edits some and builds the Set anew.
func (s *Set) Objects() ([]v1alpha1.RelayNode, []v1alpha1.Chain, []v1alpha1.Tunnel) {
	rs := make([]v1alpha1.RelayNode, len(s.Relays))
	for i, r := range s.Relays {
		rs[i] = *r.DeepCopy()
	}
	cs := make([]v1alpha1.Chain, len(s.Chains))
	for i, c := range s.Chains {
		cs[i] = *c.DeepCopy()
	}
	ts := make([]v1alpha1.Tunnel, len(s.Tunnels))
	for i, t := range s.Tunnels {
		ts[i] = *t.DeepCopy()
	}
	return rs, cs, ts
}

// HeldNames keeps the RelayNodes whose name their status says the operator
// confirmed, and returns a problem for each of the others, to be left out
// before FromObjects (which then leaves out what goes through them).
//
// A relay trusts a peer by the name in its certificate, and one CA signs
// the certificates of every namespace, so a RelayNode trusted by name must
// hold that name across namespaces. Relays read their namespace only; the
// operator, which sees them all, issues a certificate only to the RelayNode
// that holds the name and then writes status.certificateNotAfter, and it
// marks one that does not hold it with Ready reason NameConflict. Asking
// for the first closes the window between a RelayNode's creation and the
// operator's first look at it; refusing the second covers a RelayNode that
// had its certificate and then lost the name to one created in the same
// second.
func HeldNames(relays []v1alpha1.RelayNode) ([]v1alpha1.RelayNode, []error) {
	var kept []v1alpha1.RelayNode
	var problems []error
	for _, rn := range relays {
		if err := nameHeld(&rn); err != nil {
			problems = append(problems, fmt.Errorf("%s: RelayNode %q: %w", apiSource(), rn.Name, err))
			continue
		}
		kept = append(kept, rn)
	}
	return kept, problems
}

func nameHeld(rn *v1alpha1.RelayNode) error {
	if c := meta.FindStatusCondition(rn.Status.Conditions, "Ready"); c != nil && c.Reason == v1alpha1.ReasonNameConflict {
		return fmt.Errorf("status: Ready is %s (%s): relays of namespace %s trust no relay of this name, which another namespace's RelayNode holds; rename this RelayNode and what names it",
			c.Reason, c.Message, rn.Namespace)
	}
	if rn.Status.CertificateNotAfter == nil {
		return fmt.Errorf("status.certificateNotAfter: not set: the operator has issued this relay no certificate yet, so nothing says it holds its name across namespaces; it is trusted once the operator has reconciled it (if this lasts, check that an operator serves namespace %s, and its log)",
			rn.Namespace)
	}
	return nil
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
