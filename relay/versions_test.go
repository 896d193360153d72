package relay

import (
	"testing"
	"time"

	"github.com/hoplink/hoplink/manifest"
)

func TestFormerSpecs(t *testing.T) {
	parse := func(route string) *manifest.Set {
		t.Helper()
		set, err := manifest.Parse("m.yaml", []byte(`
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: useast}
spec: {listen: {port: 7403}, endpoints: ["127.0.0.1:7403"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: short}
spec: {entry: hk, exit: useast, via: [la], route: `+route+`}
`))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	direct, viaLA := parse("[hk, useast]"), parse("[hk, la, useast]")
	now := time.Now()

	// Unchanged: nothing kept.
	if got := formerSpecs(nil, direct, parse("[hk, useast]"), now); len(got) != 0 {
		t.Fatalf("an unchanged spec left versions %v", got)
	}
	// An edit keeps the spec before, for the grace.
	got := formerSpecs(nil, direct, viaLA, now)
	vs := got["default/short"]
	if len(vs) != 1 || vs[0].Chain.Spec.Route[1] != "useast" || !vs[0].Until.Equal(now.Add(versionGrace)) {
		t.Fatalf("after the edit: %+v", vs)
	}
	// A later, unrelated update keeps it while it lives...
	if again := formerSpecs(got, viaLA, viaLA, now.Add(versionGrace/2)); len(again["default/short"]) != 1 {
		t.Fatalf("an update within the grace dropped the spec before: %v", again)
	}
	// ...and drops it after.
	if later := formerSpecs(got, viaLA, viaLA, now.Add(versionGrace+time.Second)); len(later) != 0 {
		t.Fatalf("kept past the grace: %v", later)
	}
	// Edits back and forth keep at most MaxVersions.
	kept, cur := map[string][]manifest.Version(nil), direct
	for i := range 10 {
		next := viaLA
		if i%2 == 1 {
			next = direct
		}
		kept, cur = formerSpecs(kept, cur, next, now), next
	}
	if n := len(kept["default/short"]); n != manifest.MaxVersions {
		t.Fatalf("%d versions kept, want %d", n, manifest.MaxVersions)
	}
	// A Chain that goes takes its versions along.
	empty, err := manifest.Parse("e.yaml", []byte("apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: hk}\nspec: {listen: {port: 7401}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if gone := formerSpecs(got, viaLA, empty, now); len(gone) != 0 {
		t.Fatalf("a deleted Chain kept versions: %v", gone)
	}
}
