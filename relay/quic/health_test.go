package quic

import (
	"context"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
)

// A peer that answered no probe of the last round is down (routes that can
// go elsewhere do), but not lost while its connection stays up: the round's
// probes may have been dropped in a full queue. Once the connection ends,
// it is lost too.
func TestSilentPeerIsLostOnlyWithItsConnection(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	a, b := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx); err != nil {
		t.Fatal(err)
	}
	ls := a.Links()
	if ls.PeerDown("b") || ls.PeerLost("b") {
		t.Fatal("a connected peer that answers counts as down or lost")
	}
	ls.Answering("b", false)
	if !ls.PeerDown("b") {
		t.Error("a peer silent for a round is not down")
	}
	if ls.PeerLost("b") {
		t.Error("a peer silent for a round over a live connection counts as lost")
	}
	b.Close()
	deadline := time.Now().Add(10 * time.Second)
	for ls.Live("b") != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !ls.PeerLost("b") {
		t.Error("a silent peer whose connection ended is not lost")
	}
}
