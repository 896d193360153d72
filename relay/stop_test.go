package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/local"
)

// Stopping hoplink local drains every relay at once: its last lines say
// so and nothing else. Before, the entry went on routing and moved its
// routed chain off relays that were draining too ("route changed", then a
// warning that no route could be priced), and relays dialed their
// drained peers again ("peer connected" after the drain's last words).
func TestDrainingNetworkNeitherReroutesNorRedials(t *testing.T) {
	ports := map[string]int{"hk": testutil.FreePort(t), "seattle": testutil.FreePort(t), "la": testutil.FreePort(t)}
	var b strings.Builder
	for _, r := range []struct{ name, links string }{{"hk", "seattle=4ms, la=20ms"}, {"seattle", "la=4ms"}, {"la", ""}} {
		p := ports[r.name]
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s, annotations: {%s: %q}}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n",
			r.name, local.AnnotationRTT, r.links, p, p)
	}
	b.WriteString("---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: hk, exit: la, via: [seattle], mode: sum, probe: {interval: 200ms}}\n")
	set, err := manifest.Parse("stop.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	n, err := local.Start(set, relay.Config{Metrics: metrics.New(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), `msg="route changed"`) || strings.Count(logs.String(), `msg="peer connected"`) < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the network did not come up:\n%s", logs.String())
		}
	}
	before := len(logs.String())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	n.Drain(ctx)
	cancel()
	// Longer than the redial backoff and several routing rounds.
	time.Sleep(2 * time.Second)
	after := logs.String()[before:]
	if !strings.Contains(after, "peer connection ended after a drain") {
		t.Fatalf("no peer connection ended in the drain:\n%s", after)
	}
	for _, bad := range []string{`msg="peer connected"`, `msg="route changed"`, `msg="cannot route chain"`, "level=WARN"} {
		if strings.Contains(after, bad) {
			t.Errorf("while the network drained: %s\n%s", bad, after)
		}
	}
}
