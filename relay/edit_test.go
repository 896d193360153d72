package relay_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
)

// rerouted is set with Chain c's route and via relays replaced.
func rerouted(t *testing.T, set *manifest.Set, route ...string) *manifest.Set {
	t.Helper()
	rs, cs, ts := set.Objects()
	for i := range cs {
		cs[i].Spec.Route, cs[i].Spec.Via = route, route[1:len(route)-1]
	}
	out, problems := manifest.FromObjects(rs, cs, ts)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	return out
}

// TestChainEditWhileRelaysConverge: each relay takes a Chain's edit from
// its own watch, so for a moment some route along the old spec and some
// along the new. Flows opened meanwhile must go through either way: the
// exit takes the edit first (the entry still sends along the old route),
// then the entry does while the exit waits for it (a pending version).
// The second edit goes through a middle the first did not, so that only
// the pending version admits its hop into the exit: the exit's own former
// spec, kept from the first edit, does not.
func TestChainEditWhileRelaysConverge(t *testing.T) {
	target := testutil.EchoServer(t)
	port := testutil.FreePort(t)
	n, _, direct := network(t, 4, []string{"r0", "r3"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	viaR1 := rerouted(t, direct, "r0", "r1", "r3")
	viaR2 := rerouted(t, direct, "r0", "r2", "r3")
	entry, exit := n.Relays[0], n.Relays[3]
	middle, other := n.Relays[1], n.Relays[2]
	flow := func(step string) {
		t.Helper()
		c := testutil.DialTunnel(t, port)
		defer c.Close()
		want := bytes.Repeat([]byte(step), 1000)
		go c.Write(want)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: a flow failed: %v", step, err)
		}
	}
	flow("before")

	// The exit and the middle take the edit; the entry has not yet.
	for _, r := range []interface{ Update(*manifest.Set) error }{exit, middle} {
		if err := r.Update(viaR1); err != nil {
			t.Fatal(err)
		}
	}
	flow("exit-first")

	// Back to the start, then the other order along the other middle: the
	// entry takes the edit while the exit runs the old spec and waits to
	// take the new one.
	for _, r := range []interface{ Update(*manifest.Set) error }{entry, middle} {
		if err := r.Update(direct); err != nil {
			t.Fatal(err)
		}
	}
	waiting := direct.WithVersions(map[string][]manifest.Version{"default/c": {{Chain: viaR2.Chain("default/c")}}})
	if err := exit.Update(waiting); err != nil {
		t.Fatal(err)
	}
	for _, r := range []interface{ Update(*manifest.Set) error }{other, entry} {
		if err := r.Update(viaR2); err != nil {
			t.Fatal(err)
		}
	}
	flow("entry-first")
}
