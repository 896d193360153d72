package routectl

import (
	"testing"
	"time"

	"github.com/hoplink/hoplink/route"
)

// TestBrokenPartNamesIt: the reason a route changed because it broke
// names the relay or the link, and tells a relay that drains (planned)
// from one that died.
func TestBrokenPartNamesIt(t *testing.T) {
	g := &route.Graph{}
	g.SetLink("a", "b", time.Millisecond)
	rt := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name       string
		mode       route.Mode
		unmeasured []string
		down       []string
		want       string
	}{
		{"b killed: its link down, b silent", route.Sum, []string{"b"}, []string{"a -> b"},
			"relay b did not answer (down, or unreachable)"},
		{"c killed", route.Sum, []string{"c"}, []string{"b -> c"}, "relay c did not answer (down, or unreachable); link b -> c is down (c does not answer its probes)"},
		{"c drains", route.Sum, nil, []string{"b -> c (draining)"}, "relay c drains (link b -> c)"},
		{"a link not measured", route.Sum, nil, nil, "link b -> c is not measured"},
		{"pipe: the probe failed", route.Pipe, nil, nil, "link b -> c is not measured"},
	} {
		if got := brokenPart(tc.mode, g, rt, tc.unmeasured, tc.down); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	g.SetLink("b", "c", time.Millisecond)
	if got := brokenPart(route.Pipe, g, rt, nil, nil); got != "its end-to-end probe failed" {
		t.Errorf("pipe, links up: %q", got)
	}
}
