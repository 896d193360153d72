package local

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
)

type tunnelSpec struct {
	name, protocol, target string
	port                   int
	extra                  string
}

// network writes manifests for relays r0..rN-1 on loopback, a chain along
// route, and the given tunnels, then starts them in this process.
func network(t *testing.T, nRelays int, route []string, tunnels ...tunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return networkWith(t, relay.Config{}, "quic", nRelays, route, tunnels...)
}

// networkWith is network with the relays' limits from base and the
// chain's transport for TCP flows.
func networkWith(t *testing.T, base relay.Config, transport string, nRelays int, route []string, tunnels ...tunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	var b strings.Builder
	for i := range nRelays {
		p := testutil.FreePort(t)
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: r%d}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n", i, p, p)
	}
	via := ""
	if len(route) > 2 {
		via = "via: [" + strings.Join(route[1:len(route)-1], ", ") + "], "
	}
	fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: %s, exit: %s, %sroute: [%s], transport: %s}\n",
		route[0], route[len(route)-1], via, strings.Join(route, ", "), transport)
	for _, tn := range tunnels {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, protocol: %s, listen: {address: 127.0.0.1, port: %d}, target: %q %s}\n",
			tn.name, tn.protocol, tn.port, tn.target, tn.extra)
	}
	set, err := manifest.Parse("test.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("manifests: %v\n%s", err, b.String())
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

// dialTunnel connects to a tunnel's listener, retrying while peer
// connections come up (bounded).
func dialTunnel(t *testing.T, port int) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c.(*net.TCPConn)
}
