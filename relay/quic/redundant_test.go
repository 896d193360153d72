package quic

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hoplink/hoplink/relay/hop"
)

func TestRedundancyFollowsLoss(t *testing.T) {
	a := netip.MustParseAddrPort("10.0.0.1:7401")
	b := netip.MustParseAddrPort("10.0.0.2:7401")
	var changes []string
	r := newRedundancy(func(addr netip.AddrPort, on bool, _ float64) {
		changes = append(changes, addr.String()+map[bool]string{true: " on", false: " off"}[on])
	}, nil)
	t0 := time.Unix(1000, 0)
	if r.copy(a, t0) {
		t.Fatal("a copy before any loss was seen")
	}
	// a loses 1%, b 0.05%: a second's samples.
	r.judge(map[netip.AddrPort]counts{a: {sent: 1000, lost: 10}, b: {sent: 1900, lost: 1}}, t0)
	if ca, cb := r.copy(a, t0), r.copy(b, t0); !ca || cb {
		t.Fatalf("after 1%% loss to a and 0.05%% to b: copy a %v, b %v; want true, false", ca, cb)
	}
	// An IPv4 peer reported by a dual-stack socket is the same peer.
	if !r.copy(netip.MustParseAddrPort("[::ffff:10.0.0.1]:7401"), t0) {
		t.Fatal("the IPv4-mapped spelling of a lossy peer gets no copies")
	}
	// b's stray losses add up within its window of 2,000 packets...
	r.judge(map[netip.AddrPort]counts{b: {sent: 50, lost: 1}}, t0.Add(time.Second))
	if !r.copy(b, t0.Add(time.Second)) {
		t.Fatal("2 losses in 1,950 packets to b: no copies")
	}
	// ...and a window without losses enough starts over.
	c := netip.MustParseAddrPort("10.0.0.3:7401")
	r.judge(map[netip.AddrPort]counts{c: {sent: 2000, lost: 1}}, t0)
	r.judge(map[netip.AddrPort]counts{c: {sent: 100, lost: 1}}, t0.Add(time.Second))
	if r.copy(c, t0.Add(time.Second)) {
		t.Fatal("1 loss in one window and 1 in the next turned copies on")
	}

	// The budget: a burst, then the rate.
	r2 := newRedundancy(nil, nil)
	r2.judge(map[netip.AddrPort]counts{a: {sent: 100, lost: 5}}, t0)
	n := 0
	for range 10 * redundantBurst {
		if r2.copy(a, t0) {
			n++
		}
	}
	if n != redundantBurst {
		t.Fatalf("%d copies at one instant; want the burst, %d", n, redundantBurst)
	}
	later := t0.Add(10 * time.Millisecond)
	n = 0
	for range 10 * redundantBurst {
		if r2.copy(a, later) {
			n++
		}
	}
	if want := redundantRate / 100; n != want {
		t.Fatalf("%d copies 10 ms later; want %d", n, want)
	}

	// Copies stop after the hold, since with them the loss no longer shows.
	end := t0.Add(redundantHold + 2*time.Second)
	r.judge(map[netip.AddrPort]counts{a: {sent: 5000}}, end)
	if r.copy(a, end) || r.copy(b, end) {
		t.Fatal("copies go on past the hold")
	}
	if r.any.Load() {
		t.Fatal("every peer is off, but the send path still looks")
	}
	slices.Sort(changes)
	if want := []string{"10.0.0.1:7401 off", "10.0.0.1:7401 on", "10.0.0.2:7401 off", "10.0.0.2:7401 on"}; !slices.Equal(changes, want) {
		t.Fatalf("changes %q; want %q", changes, want)
	}
}

// While copies go, the link's loss is the one that turned them on, not
// the little quic-go sees through them: a packet session's choice of
// transport depends on it, and so does a flow's of unknown shape. Their
// end, on time, does not make the link clean; a window of packets sent
// without them that loses too little does.
func TestCopiesDoNotHideTheLoss(t *testing.T) {
	a := netip.MustParseAddrPort("10.0.0.1:7401")
	r := newRedundancy(nil, nil)
	t0 := time.Unix(1000, 0)
	if _, on := r.hidden(a); on {
		t.Fatal("a loss reported before any was seen")
	}
	r.judge(map[netip.AddrPort]counts{a: {sent: 400, lost: 4}}, t0)
	want := counts{400, 4}
	if j, on := r.hidden(a); !on || j != want {
		t.Fatalf("hidden loss %+v (on %v); want 4 of 400", j, on)
	}
	// Copies hide the loss: a window with them proves nothing.
	r.judge(map[netip.AddrPort]counts{a: {sent: 3000}}, t0.Add(time.Second))
	// They end on time; a quiet link says nothing either.
	end := t0.Add(redundantHold + time.Second)
	r.judge(map[netip.AddrPort]counts{a: {sent: 1500}}, end)
	r.judge(map[netip.AddrPort]counts{}, end.Add(time.Second))
	if r.copy(a, end) {
		t.Fatal("copies past the hold")
	}
	if j, on := r.hidden(a); !on || j != want {
		t.Fatalf("after the copies ended: hidden loss %+v (on %v); want 4 of 400", j, on)
	}
	// The window that went with copies at its start does not count: a
	// whole one without them does.
	r.judge(map[netip.AddrPort]counts{a: {sent: 500}}, end.Add(2*time.Second))
	if _, on := r.hidden(a); !on {
		t.Fatal("a window that began with copies made the link clean")
	}
	r.judge(map[netip.AddrPort]counts{a: {sent: redundantWindow, lost: 1}}, end.Add(3*time.Second))
	if j, on := r.hidden(a); on {
		t.Fatalf("a window without copies that lost 1 of %d left %+v", redundantWindow, j)
	}
}

// quic-go's lost count can go down (a packet declared lost arrived after
// all): that is no loss, not 2^64 of them.
func TestCountsSince(t *testing.T) {
	for _, c := range []struct{ prev, cur, want counts }{
		{counts{0, 0}, counts{100, 2}, counts{100, 2}},
		{counts{100, 2}, counts{150, 2}, counts{50, 0}},
		{counts{100, 3}, counts{150, 2}, counts{50, 0}},
	} {
		if got := c.cur.since(c.prev); got != c.want {
			t.Errorf("%+v since %+v = %+v; want %+v", c.cur, c.prev, got, c.want)
		}
	}
}

// A peer's answer counts what it had not received of the packets sent
// before the report; the count only grows, and a payload of the wrong size
// is refused.
func TestPeerCounts(t *testing.T) {
	c := &Conn{}
	for _, step := range []struct {
		sent, received, want uint64
	}{
		{100, 100, 0},
		{200, 191, 3}, // less unseenSlack (6)
		{300, 299, 3}, // packets sent after the report arrived first: lower, kept
		{400, 410, 3}, // more received than reported sent: no loss, kept
		{500, 484, 10},
	} {
		if err := c.peerCounts(hop.AppendCounts(nil, step.sent, step.received)); err != nil {
			t.Fatal(err)
		}
		if got := c.peerLost.Load(); got != step.want {
			t.Fatalf("after sent %d, received %d: lost %d; want %d", step.sent, step.received, got, step.want)
		}
	}
	if err := c.peerCounts(hop.AppendCounts(nil, 600)); err == nil {
		t.Fatal("an answer of one count was taken")
	}
}

// TestLossSaidIsARatio: a window whose declared losses outnumber what it
// sent (losses of packets sent before it, as many connections to one
// address declare them at once) reports a loss of at most 100%.
func TestLossSaidIsARatio(t *testing.T) {
	a := netip.MustParseAddrPort("10.0.0.1:7401")
	var said []float64
	r := newRedundancy(func(_ netip.AddrPort, on bool, loss float64) {
		if on {
			said = append(said, loss)
		}
	}, nil)
	r.judge(map[netip.AddrPort]counts{a: {sent: 3, lost: 12}}, time.Unix(1000, 0))
	if len(said) != 1 || said[0] > 1 || said[0] <= 0 {
		t.Errorf("12 losses declared over 3 packets sent: loss said %v, want at most 1", said)
	}
}
