package relay

import (
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hoplink/hoplink/manifest"
)

// versionGrace is how long a relay goes on admitting hops of a Chain's
// spec after it took an edit of that Chain: long enough for every relay
// of the Chain to take the edit from its own watch (seconds on a loaded
// apiserver), short enough that a route an edit removed stops being
// admitted soon after.
const versionGrace = 30 * time.Second

// formerSpecs are the Chain specs a relay that goes from manifests old to
// next still admits (manifest.Version): those kept that still live, and
// the spec old ran of every Chain whose spec next changes, for
// versionGrace. A Chain next drops takes its versions with it.
func formerSpecs(kept map[string][]manifest.Version, old, next *manifest.Set, now time.Time) map[string][]manifest.Version {
	out := map[string][]manifest.Version{}
	for key, vs := range kept {
		if next.Chain(key) == nil {
			continue
		}
		for _, v := range vs {
			if v.Live(now) {
				out[key] = append(out[key], v)
			}
		}
	}
	for _, c := range old.Chains {
		key := manifest.Key(c.Namespace, c.Name)
		n := next.Chain(key)
		if n == nil || equality.Semantic.DeepEqual(n.Spec, c.Spec) {
			continue
		}
		vs := append(out[key], manifest.Version{Chain: c, Until: now.Add(versionGrace)})
		out[key] = vs[max(0, len(vs)-manifest.MaxVersions):]
	}
	return out
}
