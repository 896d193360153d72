package relay_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/local"
)

// The tests of this package that run whole chains start them as local
// mode does (local.Start: every relay in this process, a CA in memory):
// they test the relay's roles, and local mode is only their harness.

// network starts relays r0..rN-1 on loopback, a chain along route and the
// given tunnels in this process.
func network(t *testing.T, nRelays int, route []string, tunnels ...testutil.TunnelSpec) (*local.Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return networkOver(t, "quic", nRelays, route, tunnels...)
}

// networkOver is network with the chain's transport for TCP flows.
func networkOver(t *testing.T, transport string, nRelays int, route []string, tunnels ...testutil.TunnelSpec) (*local.Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return networkWith(t, relay.Config{}, transport, nRelays, route, tunnels...)
}

// networkWith is networkOver with the relays' limits from base.
func networkWith(t *testing.T, base relay.Config, transport string, nRelays int, route []string, tunnels ...testutil.TunnelSpec) (*local.Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return startLoopback(t, base, testutil.LoopbackChain{Relays: nRelays, Route: route, Transport: transport, Tunnels: tunnels})
}

// startLoopback starts the relays of c in this process; they log to
// base.Log if it is set.
func startLoopback(t *testing.T, base relay.Config, c testutil.LoopbackChain) (*local.Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	yaml := c.Manifests(t)
	set, err := manifest.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("manifests: %v\n%s", err, yaml)
	}
	m := metrics.New(prometheus.NewRegistry())
	base.Metrics = m
	if base.Log == nil {
		base.Log = testutil.Logger()
	}
	n, err := local.Start(set, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, m, set
}
