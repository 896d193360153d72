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
	c.born = time.Now().Add(-reportGrace).UnixNano() // past its handshake
	if err := c.peerCounts(hop.AppendCounts(nil, 1<<62, 0)); err != nil {
		t.Fatal(err)
	}
	got := c.lossCounts()
	if got.sent == 0 || got.lost != got.sent {
		t.Fatalf("after an answer claiming 2^62 lost: %+v; want lost = sent > 0", got)
	}
}

// What the peer had not received of a connection's first second is its
// handshake's (packets it could not open), not the link's loss: a loss
// counted from the answers after that second leaves it out.
func TestPeerCountsLeaveOutTheFirstSecond(t *testing.T) {
	c := &Conn{born: time.Now().UnixNano()}
	answer := func(sent, received, want uint64) {
		t.Helper()
		if err := c.peerCounts(hop.AppendCounts(nil, sent, received)); err != nil {
			t.Fatal(err)
		}
		if got := c.peerLost.Load(); got != want {
			t.Fatalf("after sent %d, received %d: lost %d; want %d", sent, received, got, want)
		}
	}
	answer(20, 18, 0)
	answer(40, 37, 0) // a late Handshake packet, within the second
	c.born = time.Now().Add(-reportGrace).UnixNano()
	answer(100, 97, 0)
	answer(200, 195, 2)
	answer(300, 290, 7)
}
