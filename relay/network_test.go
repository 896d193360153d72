package relay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// testNetwork is relays of one manifest set running in this process, with
// a CA of their own, for tests that attack one with a peer's certificate.
type testNetwork struct {
	relays map[string]*Relay
	ca     *pki.CA
	m      *metrics.Metrics
}

// startNetwork starts relays named names on loopback ports of their own,
// with the Chains and Tunnels of rest. They follow the routes the
// manifests give (no route controller asks its peers anything).
func startNetwork(t *testing.T, names []string, rest string) *testNetwork {
	t.Helper()
	var b strings.Builder
	for _, n := range names {
		p := testutil.FreePort(t)
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n", n, p, p)
	}
	b.WriteString(rest)
	set, err := manifest.Parse("test.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("manifests: %v\n%s", err, b.String())
	}
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	n := &testNetwork{relays: map[string]*Relay{}, ca: ca, m: metrics.New(prometheus.NewRegistry())}
	for _, name := range names {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{Name: name, Manifests: set, Identity: id, Metrics: n.m, Log: testutil.Logger()})
		if err == nil {
			err = r.Start()
		}
		if err != nil {
			t.Fatalf("relay %s: %v", name, err)
		}
		t.Cleanup(func() { r.Close() })
		n.relays[name] = r
	}
	return n
}

// linked waits until relay from has a QUIC connection to relay to.
func (n *testNetwork) linked(t *testing.T, from, to string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.relays[from].peers.Live(to) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s has no connection to %s", from, to)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
