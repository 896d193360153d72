package relay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hoplink/hoplink/manifest"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// A peer's bound of connections leaves room for what its relays dial:
// per process the control link and a link per Tunnel it may send this
// relay flows of (capped as the dialer caps them), for each process the
// manifests know under its name and one more.
func TestMaxConnsLeavesRoomForTheLinks(t *testing.T) {
	var b strings.Builder
	for _, r := range []string{"a", "b", "c", "d"} {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {endpoints: [\"%s.example:7401\"]}\n", r, r)
	}
	chain := func(name, spec string, tunnels int) {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: %s}\nspec: %s\n", name, spec)
		for i := range tunnels {
			fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s-%d}\nspec: {chain: %s, listen: {port: %d}, target: \"127.0.0.1:1\"}\n",
				name, i, name, 10000+len(name)*100+i)
		}
	}
	chain("abc", "{entry: a, exit: c, via: [b], route: [a, b, c]}", 2)
	chain("routed", "{entry: a, exit: c, via: [b], mode: sum}", 1)
	chain("cb", "{entry: c, exit: b, route: [c, b]}", 1)
	chain("many", "{entry: d, exit: b, route: [d, b]}", 20)
	set, err := manifest.Parse("test.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		self, peer string
		want       int
	}{
		{"b", "a", (1 + 3) * 2}, // abc's two and the routed one
		{"c", "b", (1 + 3) * 2}, // the same, a hop on
		{"c", "a", (1 + 1) * 2}, // routed: a may go to c directly
		{"b", "c", (1 + 1) * 2},
		{"a", "c", 1 * 2},                          // no Tunnel: the control link
		{"b", "d", (1 + rquic.MaxTunnelLinks) * 2}, // 20 Tunnels share 15 links
		{"b", "nobody", 1},
	} {
		if got := maxConns(set, tc.self, tc.peer); got != tc.want {
			t.Errorf("%s's connections to %s: bound %d, want %d", tc.peer, tc.self, got, tc.want)
		}
	}
	// A DaemonSet on five nodes: five processes under one name.
	set.Relay("a").Status.Desired = 5
	if got, want := maxConns(set, "b", "a"), (1+3)*6; got != want {
		t.Errorf("a DaemonSet of 5: bound %d, want %d", got, want)
	}
}
