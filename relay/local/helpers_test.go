package local

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
)

// network starts relays r0..rN-1 on loopback, a chain along route and the
// given tunnels in this process.
func network(t *testing.T, nRelays int, route []string, tunnels ...testutil.TunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return networkWith(t, relay.Config{}, "quic", nRelays, route, tunnels...)
}

// networkWith is network with the relays' limits from base and the
// chain's transport for TCP flows.
func networkWith(t *testing.T, base relay.Config, transport string, nRelays int, route []string, tunnels ...testutil.TunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	yaml := testutil.LoopbackChain{Relays: nRelays, Route: route, Transport: transport, Tunnels: tunnels}.Manifests(t)
	set, err := manifest.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("manifests: %v\n%s", err, yaml)
	}
	m := metrics.New(prometheus.NewRegistry())
	base.Metrics = m
	if base.Log == nil {
		base.Log = testutil.Logger()
	}
	n, err := Start(set, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, m, set
}
