package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// A peer's connection that fills its budget of streams waiting for their
// header refuses its own further streams, not those of the peer's other
// connections (its other Tunnels' links): the budget is a connection's.
func TestHeaderBudgetIsPerConnection(t *testing.T) {
	target := testutil.EchoServer(t)
	hkPort, laPort, tPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	set, err := manifest.Parse("test.yaml", []byte(fmt.Sprintf(`
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %d}, target: %q}
`, hkPort, hkPort, laPort, laPort, tPort, target)))
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.NewCA("test")
	laID, _ := ca.Identity("la")
	m := metrics.New(prometheus.NewRegistry())
	la, err := New(Config{Name: "la", Manifests: set, Identity: laID, Metrics: m, Log: testutil.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Start(); err != nil {
		t.Fatal(err)
	}
	defer la.Close()

	// hk, la's previous hop, turned hostile: one connection full of half
	// headers, and a second one for a flow.
	hkID, _ := ca.Identity("hk")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func() *quicgo.Conn {
		c, err := quicgo.DialAddr(ctx, la.Addr().String(), hkID.ClientConfig("la"), &quicgo.Config{EnableDatagrams: true, MaxIncomingStreams: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseWithError(0, "") })
		return c
	}
	header, err := (&hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"la"}, Target: target}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	halves := dial()
	const over = 16
	for range nexthop.MaxPendingHeaders + over {
		s, err := halves.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(header[:6])
	}
	limited := func() float64 { return promtest.ToFloat64(m.Rejected.WithLabelValues("la", "header_limit")) }
	for limited() < over {
		if ctx.Err() != nil {
			t.Fatalf("%v of the %d streams past the budget refused", limited(), over)
		}
		time.Sleep(10 * time.Millisecond)
	}

	other := dial()
	s, err := other.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.SetDeadline(time.Now().Add(10 * time.Second))
	s.Write(append(header, "hello"...))
	s.Close()
	got, err := io.ReadAll(s)
	var reset *quicgo.StreamError
	if errors.As(err, &reset) || string(got) != "hello" {
		t.Fatalf("a flow on the peer's other connection: %q, %v (header_limit refusals: %v)", got, err, limited())
	}
	if v := limited(); v != over {
		t.Errorf("%v streams refused for the budget, want the %d past it", v, over)
	}
}
