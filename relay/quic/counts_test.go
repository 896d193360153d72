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
	c.born.Store(sinceStart() - int64(reportGrace)) // past its handshake
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
// counted from the answers after that second leaves it out, up to
// handshakeSlack; more than that in the first second is loss still.
func TestPeerCountsLeaveOutTheFirstSecond(t *testing.T) {
	type answer struct {
		sent, received uint64
		late           bool // answered after the connection's first second
		want           uint64
	}
	for name, answers := range map[string][]answer{
		"handshake": {
			{20, 18, false, 0},
			{40, 37, false, 0}, // a late Handshake packet, within the second
			{100, 97, true, 0},
			{200, 195, true, 2},
			{300, 290, true, 7},
		},
		"lossy first second": {
			{100, 90, false, 0},
			{200, 189, true, 7}, // the slack is 4, not the 10 missing
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := &Conn{}
			c.born.Store(sinceStart())
			for _, a := range answers {
				if a.late {
					c.born.Store(sinceStart() - int64(reportGrace))
				}
				if err := c.peerCounts(hop.AppendCounts(nil, a.sent, a.received)); err != nil {
					t.Fatal(err)
				}
				if got := c.peerLost.Load(); got != a.want {
					t.Fatalf("after sent %d, received %d: lost %d; want %d", a.sent, a.received, got, a.want)
				}
			}
		})
	}
}

// A connection's handshake starts its grace, as the endpoint makes it.
func TestNewConnStartsItsGrace(t *testing.T) {
	if c := newConn(nil, "peer", true); c.born.Load() == 0 {
		t.Fatal("newConn left born at 0: the handshake's packets would count as loss")
	}
}
