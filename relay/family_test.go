package relay

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/eyeballs"
)

// A relay whose next hop is published on both families, every relay
// listening on every address (no spec.listen.address, a dual-stack
// socket): the link runs on IPv6 while both answer, on IPv4 while the
// IPv6 endpoint is dead, and the relay's status (hoplink status's FAMILY)
// and hoplink_peer_family_info say which.
func TestStatusSaysTheLinksFamily(t *testing.T) {
	if c, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	for _, tc := range []struct {
		name, family string
		eps          func(port, dead int) string
	}{
		{"both answer", eyeballs.IPv6, func(p, _ int) string { return fmt.Sprintf(`["127.0.0.1:%d", "[::1]:%d"]`, p, p) }},
		{"ipv6 endpoint dead", eyeballs.IPv4, func(p, dead int) string { return fmt.Sprintf(`["[::1]:%d", "127.0.0.1:%d"]`, dead, p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb, dead := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
			set, err := manifest.Parse("test.yaml", fmt.Appendf(nil, `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: %d}, endpoints: ["[::1]:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: %d}, endpoints: %s}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: a, exit: b, route: [a, b]}
`, pa, pa, pb, tc.eps(pb, dead)))
			if err != nil {
				t.Fatal(err)
			}
			ca, err := pki.NewCA("test")
			if err != nil {
				t.Fatal(err)
			}
			m := metrics.New(prometheus.NewRegistry())
			relays := map[string]*Relay{}
			for _, name := range []string{"a", "b"} {
				id, err := ca.Identity(name)
				if err != nil {
					t.Fatal(err)
				}
				r, err := New(Config{Name: name, Manifests: set, Identity: id, Metrics: m, Log: testutil.Logger()})
				if err == nil {
					err = r.Start()
				}
				if err != nil {
					t.Fatalf("relay %s: %v", name, err)
				}
				t.Cleanup(func() { r.Close() })
				relays[name] = r
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				st := relays["a"].status()
				if len(st.Peers) == 1 && st.Peers[0].Up && st.Peers[0].Family != "" &&
					promtest.CollectAndCount(m.PeerFamily) == 1 {
					if st.Peers[0].Family != tc.family {
						t.Errorf("status: the link to b runs on %q, want %q", st.Peers[0].Family, tc.family)
					}
					if v := promtest.ToFloat64(m.PeerFamily.WithLabelValues("a", "b", tc.family)); v != 1 {
						t.Errorf("hoplink_peer_family_info{family=%q} = %v, want 1", tc.family, v)
					}
					// hoplink probe's table, as the relay answers it.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					a := relays["a"]
					tb := a.measure.table(ctx, a.set.Load().Chain("default/c"), 0)
					if len(tb.Links) != 1 || tb.Links[0].Family != tc.family {
						t.Errorf("probe table's links %+v, want b's on %s", tb.Links, tc.family)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("no link from a to b with its family in 10 s: %+v", st.Peers)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
