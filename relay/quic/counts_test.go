package quic

import (
	"context"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
)

// A peer cannot make a connection count more packets lost than it sent,
// however large the loss its answer claims.
func TestPeerLossIsAtMostWhatWasSent(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	b := testEndpoint(t, ca, "b", nil)
	a := testEndpoint(t, ca, "a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := a.Links().Link("b", Control, []string{b.Addr().String()}).OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.peerCounts(hop.AppendCounts(nil, 1<<62, 0)); err != nil {
		t.Fatal(err)
	}
	got := c.lossCounts()
	if got.sent == 0 || got.lost != got.sent {
		t.Fatalf("after an answer claiming 2^62 lost: %+v; want lost = sent > 0", got)
	}
}
