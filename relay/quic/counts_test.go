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

// Packets quic-go sends that cannot arrive (a handshake's the peer could
// not open, path MTU probes) are not the link's loss: up to unseenSlack of
// what the peer missed is left out, and the rest counts.
func TestPeerCountsLeaveOutTheSlack(t *testing.T) {
	c := &Conn{}
	for _, a := range []struct{ sent, received, want uint64 }{
		{20, 18, 0},
		{40, 35, 0},  // two Handshake packets and three MTU probes
		{100, 94, 0}, // one more
		{200, 193, 1},
		{300, 290, 4},
	} {
		if err := c.peerCounts(hop.AppendCounts(nil, a.sent, a.received)); err != nil {
			t.Fatal(err)
		}
		if got := c.peerLost.Load(); got != a.want {
			t.Fatalf("after sent %d, received %d: lost %d; want %d", a.sent, a.received, got, a.want)
		}
	}
}
