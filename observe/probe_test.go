package observe

import (
	"context"
	"testing"

	"github.com/hoplink/hoplink/manifest"
)

// A chain named with a typo is refused before any relay is asked, with
// the chains as they would be typed and the nearest one.
func TestProbeChainTypoSuggestsTheChain(t *testing.T) {
	set, err := manifest.Load("../examples/local")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ chain, ns, want string }{
		{"fastst", "default", `no Chain "fastst" in the manifests (chains: to-east, fastest); did you mean "fastest"?`},
		{"default/to-eats", "edge", `no Chain "default/to-eats" in the manifests (chains: default/to-east, default/fastest); did you mean "default/to-east"?`},
		{"west", "default", `no Chain "west" in the manifests (chains: to-east, fastest)`},
	} {
		_, err := ProbeChain(context.Background(), set, nil, tc.chain, tc.ns)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s in %s: %v, want %s", tc.chain, tc.ns, err, tc.want)
		}
	}
}
