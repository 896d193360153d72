package manifest

import (
	"slices"
	"strings"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Named lists every RelayNode a Chain's spec names (entry, via relays,
// exit, route), once each, sorted: the relays that read the Chain, valid or
// not, so that each can say what is wrong with it.
func Named(c *v1alpha1.Chain) []string {
	names := append([]string{c.Spec.Entry, c.Spec.Exit}, c.Spec.Via...)
	names = append(names, c.Spec.Route...)
	names = slices.DeleteFunc(names, func(n string) bool { return n == "" })
	slices.Sort(names)
	return slices.Compact(names)
}

// Labelled lists the relays that an object's member labels
// (v1alpha1.MemberLabel) name, sorted.
func Labelled(labels map[string]string) []string {
	var out []string
	for k := range labels {
		if name, ok := strings.CutPrefix(k, v1alpha1.LabelMemberPrefix); ok && name != "" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Current says whether relay self acts on a Chain's spec as it stands,
// given the Chain's member labels; if not, it goes on with the Chain as it
// last took it (none if it never had it). The operator labels a Chain for
// an edit in two steps, and self takes the spec:
//
//   - only once every relay the spec names has a label: the operator adds
//     one only when the RelayNodes and Tunnels that relay needs with the
//     Chain carry its label too, so a relay acting earlier could miss
//     them;
//   - only while the spec names self: a relay an edit took out keeps the
//     Chain as it was until its label goes, so flows already sent its way
//     are admitted;
//   - while a relay is joining (v1alpha1.MemberJoining), only if self is
//     joining too and is not the entry: the new relays learn the Chain
//     before any flow can come their way.
func Current(c *v1alpha1.Chain, self string) bool {
	named := Named(c)
	if !slices.Contains(named, self) {
		return false
	}
	mine := c.Labels[v1alpha1.MemberLabel(self)] == v1alpha1.MemberJoining && self != c.Spec.Entry
	for _, n := range named {
		v, ok := c.Labels[v1alpha1.MemberLabel(n)]
		if !ok || v == v1alpha1.MemberJoining && n != self && !mine {
			return false
		}
	}
	return true
}
