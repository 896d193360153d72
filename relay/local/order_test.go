package local

import (
	"slices"
	"testing"

	"github.com/hoplink/hoplink/manifest"
)

// The demo's relays start in the order they are dialed: la (dials none),
// seattle (dials la), hk (dials both); hk started first found no relay
// behind seattle's emulated link and warned of a connection reset.
func TestRelaysStartAfterThoseTheyDial(t *testing.T) {
	set, err := manifest.Load("../../examples/local")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range dialedFirst(set) {
		names = append(names, set.Relays[i].Name)
	}
	if want := []string{"la", "seattle", "hk"}; !slices.Equal(names, want) {
		t.Fatalf("start order %v, want %v", names, want)
	}
	// A cycle (a -> b -> a) still starts each relay once.
	cyc, err := manifest.Parse("c.yaml", []byte(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: ab}
spec: {entry: a, exit: b, route: [a, b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: ba}
spec: {entry: b, exit: a, route: [b, a]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := dialedFirst(cyc); len(got) != 2 || got[0] == got[1] {
		t.Fatalf("cycle: order %v", got)
	}
}
