package observe

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
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

// fakeProber answers at the endpoints in up only, as a relay whose other
// family this host cannot reach.
type fakeProber struct {
	up    map[string]bool
	mu    sync.Mutex // ProbeChain asks relays at once
	asked []string
}

func (f *fakeProber) check(endpoint string) error {
	if !f.up[endpoint] {
		return fmt.Errorf("%s: connection refused", endpoint)
	}
	return nil
}

func (f *fakeProber) Status(_ context.Context, relay, endpoint string) (*adminapi.Status, error) {
	if err := f.check(endpoint); err != nil {
		return nil, err
	}
	return &adminapi.Status{Relay: relay, Ready: true, Chains: []adminapi.ChainRoute{{Chain: "default/c", Mode: "static", Route: []string{"a", "b"}}}}, nil
}

func (f *fakeProber) Links(_ context.Context, relay, endpoint, _ string, _ time.Duration) (*measure.Table, error) {
	f.mu.Lock()
	f.asked = append(f.asked, "links "+relay+" "+endpoint)
	f.mu.Unlock()
	if err := f.check(endpoint); err != nil {
		return nil, err
	}
	return &measure.Table{Relay: relay, Links: []measure.Link{{To: "b", Up: true, Family: "ipv4"}}}, nil
}

func (f *fakeProber) Trace(_ context.Context, relay, endpoint, _ string, routes [][]string) ([]measure.Trace, error) {
	if err := f.check(endpoint); err != nil {
		return nil, err
	}
	var out []measure.Trace
	for _, r := range routes {
		out = append(out, measure.Trace{Route: r})
	}
	return out, nil
}

// A relay published on both families, of which this host reaches only
// IPv4: probe asks it where it answers, as status does, not at its first
// endpoint.
func TestProbeAsksTheEndpointThatAnswers(t *testing.T) {
	set, err := manifest.Parse("test.yaml", []byte(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {endpoints: ["[fd00::a]:7401", "10.0.0.10:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {endpoints: ["[fd00::b]:7401", "10.0.0.11:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: a, exit: b, route: [a, b]}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProber{up: map[string]bool{"10.0.0.10:7401": true, "10.0.0.11:7401": true}}
	pr, err := ProbeChain(context.Background(), set, f, "c", "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.Hops) != 1 || pr.Hops[0].Err != "" || pr.Hops[0].Family != "ipv4" {
		t.Errorf("hops %+v, want a -> b measured, on ipv4", pr.Hops)
	}
	if pr.TargetErr != "" {
		t.Errorf("the exit was not asked where it answers: %s", pr.TargetErr)
	}
	for _, a := range f.asked {
		if strings.Contains(a, "fd00") {
			t.Errorf("asked at an endpoint that did not answer status: %s", a)
		}
	}
}
