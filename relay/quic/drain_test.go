package quic

import (
	"context"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
)

// A relay that drains tells the peer connected to it, and answers the
// peer's probes with the same news rather than an echo, so that a peer
// counts the link down. A new connection (the relay restarted) is not
// draining.
func TestDrainReachesPeers(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	a, b := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", make(chan *Conn, 8))
	told := make(chan string, 4)
	a.opts.OnPeerDraining = func(peer string) { told <- peer }
	echoes := make(chan []byte, 8)
	a.opts.OnProbeEcho = func(_ string, p []byte) { echoes <- p }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendProbe([]byte("12345678")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-echoes:
	case <-ctx.Done():
		t.Fatal("no echo before the drain")
	}
	if a.PeerDraining("b") || c.Draining() {
		t.Fatal("draining before b drains")
	}

	b.Drain()
	select {
	case p := <-told:
		if p != "b" {
			t.Fatalf("told %q drains", p)
		}
	case <-ctx.Done():
		t.Fatal("a never learned that b drains")
	}
	if !a.PeerDraining("b") || !c.Draining() {
		t.Fatal("a does not count b as draining")
	}
	c.SendProbe([]byte("87654321"))
	select {
	case <-echoes:
		t.Fatal("a draining relay echoed a probe")
	case <-time.After(300 * time.Millisecond):
	}

	// The connection b drained on ends: b no longer counts as draining.
	c.CloseWithError(0, "")
	if a.PeerDraining("b") {
		t.Error("b still counts as draining once the connection it said so on is gone")
	}
}
