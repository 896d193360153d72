package manifest

import (
	"slices"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A Version is another spec of a Chain whose hops a relay admits beside
// the Chain's own while the Chain's relays converge on an edit. Each
// relay takes an edit when its own watch delivers it, so for a moment
// some send along the old spec and some along the new; a relay that
// admitted only the spec it runs would reset those flows.
//
//   - The spec a relay ran before it took the edit, until Until: flows of
//     peers that have not taken it yet.
//   - The edit a relay waits to take (Current says not yet), with no
//     Until: flows of peers that took it first.
type Version struct {
	Chain *v1alpha1.Chain
	// Until is when the version stops counting; zero: while it is given.
	Until time.Time
}

// Live says whether v still counts at now.
func (v Version) Live(now time.Time) bool { return v.Until.IsZero() || now.Before(v.Until) }

// MaxVersions bounds the versions kept per Chain: a Chain edited many
// times within a grace period admits its latest few specs, not all.
const MaxVersions = 4

// WithVersions returns a copy of s whose Chains also admit the hops of
// versions (Chain key -> its versions), beside those s has.
func (s *Set) WithVersions(versions map[string][]Version) *Set {
	if len(versions) == 0 {
		return s
	}
	c := *s
	c.versions = make(map[string][]Version, len(s.versions)+len(versions))
	for k, vs := range s.versions {
		c.versions[k] = vs
	}
	for k, vs := range versions {
		c.versions[k] = append(slices.Clip(c.versions[k]), vs...)
	}
	return &c
}

// Versions are the versions of the Chain with that key.
func (s *Set) Versions(key string) []Version { return s.versions[key] }

// AdmitsHop is AllowsHop for Chain c of s or any of its versions live at
// now: the hop a relay admits a stream on.
func (s *Set) AdmitsHop(c *v1alpha1.Chain, prev, self string, rest []string, now time.Time) bool {
	if AllowsHop(c, prev, self, rest) {
		return true
	}
	for _, v := range s.versions[Key(c.Namespace, c.Name)] {
		if v.Live(now) && AllowsHop(v.Chain, prev, self, rest) {
			return true
		}
	}
	return false
}
