package routectl

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/route"
)

const ms = time.Millisecond

// script is a Measurer that answers from a map of links, as the relays
// would measure them, and records how each relay was asked. The relay
// tests measure real relays; this one pins down a round's logic.
type script struct {
	mu      sync.Mutex
	links   map[[2]string]time.Duration // one way is enough: routes go forward
	direct  map[string]bool             // relays the entry reaches directly
	pipeErr map[string]bool             // routes whose end-to-end probe fails
	down    map[[2]string]bool          // links their relay reports down
	asked   []string                    // "relay via a,b"
	// gates hold a relay's answers until closed (a busy or hung relay):
	// until its context ends as well when honorCtx, else regardless, as a
	// call slow to return after its context ended would.
	gates     map[string]chan struct{}
	honorCtx  bool
	traceGate chan struct{} // holds every trace, regardless of its context
}

func (s *script) Links(ctx context.Context, req LinksRequest) (*measure.Table, error) {
	s.mu.Lock()
	s.asked = append(s.asked, req.Relay+" via "+strings.Join(req.Through, ","))
	if gate := s.gates[req.Relay]; gate != nil {
		s.mu.Unlock()
		if s.honorCtx {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			<-gate
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if len(req.Through) == 0 && !s.direct[req.Relay] && req.Relay != req.Chain.Spec.Entry {
		return nil, fmt.Errorf("no link from the entry to %s", req.Relay)
	}
	t := &measure.Table{Relay: req.Relay}
	for l, rtt := range s.links {
		if l[0] == req.Relay {
			// Each relay says which transport it took: TLS toward la.
			tr := "quic"
			if l[1] == "la" {
				tr = "tls"
			}
			t.Links = append(t.Links, measure.Link{To: l[1], Up: !s.down[l], RTT: measure.Duration(rtt), Transport: tr, TransportReason: "measured"})
		}
	}
	return t, nil
}

func (s *script) Trace(_ context.Context, c *v1alpha1.Chain, routes [][]string) ([]measure.Trace, error) {
	s.mu.Lock()
	if gate := s.traceGate; gate != nil {
		s.mu.Unlock()
		<-gate
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	out := make([]measure.Trace, len(routes))
	for i, r := range routes {
		out[i].Route = r
		if s.pipeErr[route.Key(r)] {
			out[i].Err = "timed out"
			continue
		}
		var sum time.Duration
		for j := 1; j < len(r); j++ {
			sum += s.links[[2]string{r[j-1], r[j]}]
		}
		out[i].RTT = measure.Duration(sum + ms) // a relay's processing
	}
	return out, nil
}

func chain(mode v1alpha1.RouteMode) *v1alpha1.Chain {
	c := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"}, Spec: v1alpha1.ChainSpec{
		Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}, Mode: mode,
	}}
	c.Default()
	return c
}

func newLoop(m Measurer, c *v1alpha1.Chain) *loop {
	return &loop{c: New(Options{Measurer: m}), key: "default/c", chain: c}
}

// An entry with a link to seattle alone reads la's table through seattle,
// and useast's through seattle and la, in successive phases of one round.
func TestGatherReachesRelaysThroughOthers(t *testing.T) {
	s := &script{
		links:  map[[2]string]time.Duration{{"hk", "seattle"}: 10 * ms, {"seattle", "la"}: 10 * ms, {"la", "useast"}: 10 * ms},
		direct: map[string]bool{"seattle": true},
	}
	l := newLoop(s, chain(v1alpha1.ModeSum))
	d := l.round(context.Background(), l.chain)
	if route.Key(d.Route) != "hk,seattle,la,useast" || len(d.Unmeasured) != 0 {
		t.Fatalf("decision %+v", d)
	}
	for _, want := range []string{"la via seattle", "useast via seattle,la"} {
		if !slices.Contains(s.asked, want) {
			t.Errorf("never asked %q; asked %v", want, s.asked)
		}
	}
	// Under transport auto the decision carries each link's transport as
	// its relay said it, in route order; explicit transports carry none.
	var got []string
	for _, lt := range d.Transports {
		got = append(got, lt.From+">"+lt.To+":"+string(lt.Transport)+"/"+lt.Reason)
	}
	if want := []string{"hk>seattle:quic/measured", "seattle>la:tls/measured", "la>useast:quic/measured"}; !slices.Equal(got, want) {
		t.Errorf("transports %q, want %q", got, want)
	}
	explicit := chain(v1alpha1.ModeSum)
	explicit.Spec.Transport = v1alpha1.TransportQUIC
	l = newLoop(s, explicit)
	if d := l.round(context.Background(), l.chain); len(d.Transports) != 0 {
		t.Errorf("transport quic: transports %+v", d.Transports)
	}
}

// In pipe mode one failed probe of the current route keeps it; a second in
// a row replaces it, at once.
func TestPipeToleratesOneMissedProbe(t *testing.T) {
	s := &script{
		links: map[[2]string]time.Duration{
			{"hk", "la"}: 20 * ms, {"la", "useast"}: 10 * ms, {"hk", "useast"}: 50 * ms,
		},
		direct:  map[string]bool{"seattle": true, "la": true, "useast": true},
		pipeErr: map[string]bool{},
	}
	l := newLoop(s, chain(v1alpha1.ModePipe))
	ctx := context.Background()
	if d := l.round(ctx, l.chain); route.Key(d.Route) != "hk,la,useast" || !d.Changed {
		t.Fatalf("first round: %+v", d)
	}
	s.pipeErr["hk,la,useast"] = true
	if d := l.round(ctx, l.chain); d.Changed || route.Key(d.Route) != "hk,la,useast" {
		t.Fatalf("one missed probe moved the chain: %+v", d)
	}
	d := l.round(ctx, l.chain)
	if !d.Changed || route.Key(d.Route) != "hk,useast" {
		t.Fatalf("two missed probes in a row kept the chain: %+v", d)
	}
}

// A round that keeps the current route over a cheaper candidate says so,
// in sum mode (by the links' sums) as in pipe mode (by the traces).
func TestRoundSaysWhyItKeepsTheRoute(t *testing.T) {
	s := &script{
		links: map[[2]string]time.Duration{
			{"hk", "useast"}: 10 * ms, {"hk", "seattle"}: 5 * ms, {"seattle", "useast"}: 4500 * time.Microsecond,
		},
		direct: map[string]bool{"seattle": true, "la": true, "useast": true},
	}
	for _, mode := range []v1alpha1.RouteMode{v1alpha1.ModeSum, v1alpha1.ModePipe} {
		l := newLoop(s, chain(mode))
		l.sel.Start([]string{"hk", "useast"})
		d := l.round(context.Background(), l.chain)
		want := "kept: candidate hk,seattle,useast is 500µs cheaper, below the 2ms / 5% switch threshold"
		if d.Changed || route.Key(d.Route) != "hk,useast" || d.Kept != want {
			t.Errorf("%s: route %v changed %v kept %q; want hk,useast kept %q", mode, d.Route, d.Changed, d.Kept, want)
		}
	}
}

// A chain's first rounds wait for every link between its relays, not only
// for every relay: a route taken while the better links still came up
// would change a moment later. After the first moments a link that is
// down does not hold the chain back.
func TestFirstRouteWaitsForLinksComingUp(t *testing.T) {
	s := &script{
		links: map[[2]string]time.Duration{
			{"hk", "useast"}: 40 * ms, {"hk", "seattle"}: 10 * ms, {"seattle", "useast"}: 8 * ms,
		},
		direct: map[string]bool{"seattle": true, "la": true, "useast": true},
		down:   map[[2]string]bool{{"seattle", "useast"}: true},
	}
	l := newLoop(s, chain(v1alpha1.ModeSum))
	l.born = time.Now()
	d := l.round(context.Background(), l.chain)
	if len(d.Route) != 0 || d.Err == nil || !strings.Contains(d.Err.Error(), "seattle -> useast") {
		t.Fatalf("first round with seattle -> useast down: route %v, err %v; want no route yet, waiting for the link", d.Route, d.Err)
	}
	s.mu.Lock()
	s.down = nil
	s.mu.Unlock()
	if d := l.round(context.Background(), l.chain); route.Key(d.Route) != "hk,seattle,useast" || !d.Changed || d.Reason != "first route" {
		t.Fatalf("once the link is up: %+v", d)
	}

	s.down = map[[2]string]bool{{"seattle", "useast"}: true}
	l = newLoop(s, chain(v1alpha1.ModeSum))
	l.born = time.Now().Add(-2 * time.Second) // past the first moments
	if d := l.round(context.Background(), l.chain); route.Key(d.Route) != "hk,useast" || d.Err != nil {
		t.Fatalf("a link down after the first moments: %+v; want the route without it", d)
	}
}

// rounds counts the rounds a script was asked for, by the entry's table.
func (s *script) rounds() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.asked {
		if a == "hk via " {
			n++
		}
	}
	return n
}

// TestRoundsFollowTheClock: on an injected clock, a chain's rounds come one
// interval apart, half an interval after a challenger's first win, and not
// before.
func TestRoundsFollowTheClock(t *testing.T) {
	s := &script{
		links:  map[[2]string]time.Duration{{"hk", "useast"}: 50 * ms, {"hk", "la"}: 10 * ms, {"la", "useast"}: 10 * ms},
		direct: map[string]bool{"seattle": true, "la": true, "useast": true},
	}
	fake := testingclock.NewFakeClock(time.Now())
	var mu sync.Mutex
	var decided []Decision
	c := New(Options{Measurer: s, Clock: fake, Decide: func(d Decision) {
		mu.Lock()
		decided = append(decided, d)
		mu.Unlock()
	}})
	defer c.Close()
	ch := chain(v1alpha1.ModeSum)
	ch.Spec.Probe = &v1alpha1.ProbeSpec{Interval: &metav1.Duration{Duration: 10 * time.Second}}
	c.Upsert(ch, func(*v1alpha1.Chain) []string { return []string{"hk", "useast"} })

	// waitRounds waits (in real time, bounded) for the loop to finish n
	// rounds and sleep on the fake clock.
	waitRounds := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for s.rounds() < n || !fake.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatalf("rounds: %d, want %d", s.rounds(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitRounds(1) // the first round comes at once
	// hk,la,useast (20 ms) beats the current hk,useast (50 ms) once: the
	// confirming round is due half an interval later, not sooner.
	fake.Step(4 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := s.rounds(); n != 1 {
		t.Fatalf("%d rounds before half an interval passed", n)
	}
	fake.Step(time.Second + time.Millisecond)
	waitRounds(2)
	mu.Lock()
	last := decided[len(decided)-1]
	mu.Unlock()
	if route.Key(last.Route) != "hk,la,useast" || !last.Changed {
		t.Fatalf("after two wins: %+v", last)
	}
	fake.Step(9 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := s.rounds(); n != 2 {
		t.Fatalf("%d rounds within one interval", n)
	}
	fake.Step(time.Second + time.Millisecond)
	waitRounds(3)
}

// asks counts the link requests relay was sent.
func (s *script) asks(relay string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.asked {
		if strings.HasPrefix(a, relay+" via ") {
			n++
		}
	}
	return n
}

// boundedRound runs a round of l, failing the test if it has not ended
// within 10 s: fifty times the intervals these tests use.
func boundedRound(t *testing.T, l *loop) Decision {
	t.Helper()
	done := make(chan Decision, 1)
	go func() { done <- l.round(context.Background(), l.chain) }()
	select {
	case d := <-done:
		return d
	case <-time.After(10 * time.Second):
		t.Fatalf("a round of a chain probed every %v still runs after 10 s", Interval(l.chain))
		return Decision{}
	}
}

// fastChain is probed every second: rounds that wait for what does not
// answer end soon, and the scripted relays that do answer have the round's
// wait (a few hundred milliseconds) to do so on a busy host.
func fastChain(mode v1alpha1.RouteMode) *v1alpha1.Chain {
	c := chain(mode)
	c.Spec.Probe.Interval = &metav1.Duration{Duration: time.Second}
	return c
}

// A round ends within its interval with what answered, even when its
// measurer's calls do not end with their context (a relay's table and
// every trace are held here): it does not wait for them.
func TestRoundDoesNotWaitPastItsInterval(t *testing.T) {
	s := &script{
		links:     map[[2]string]time.Duration{{"hk", "la"}: 10 * ms, {"la", "useast"}: 10 * ms, {"hk", "useast"}: 50 * ms},
		direct:    map[string]bool{"seattle": true, "la": true, "useast": true},
		gates:     map[string]chan struct{}{"la": make(chan struct{})},
		traceGate: make(chan struct{}),
	}
	defer close(s.traceGate)
	defer close(s.gates["la"])
	for _, mode := range []v1alpha1.RouteMode{v1alpha1.ModeSum, v1alpha1.ModePipe} {
		l := newLoop(s, fastChain(mode))
		start := time.Now()
		d := boundedRound(t, l)
		took := time.Since(start)
		t.Logf("%s: %v, decision %+v", mode, took, d)
		if !slices.Equal(d.Unmeasured, []string{"la"}) {
			t.Errorf("%s: unmeasured %v, want [la]", mode, d.Unmeasured)
		}
		if mode == v1alpha1.ModeSum && route.Key(d.Route) != "hk,useast" {
			t.Errorf("sum: route %v, want the one that could be priced, hk,useast", d.Route)
		}
	}
}

// A relay that answers every request, but after the round's wait (a busy
// host), still prices routes: its answer counts in the next rounds while
// it is younger than two intervals. One request is in flight at a time.
func TestLateTablesCountInTheNextRounds(t *testing.T) {
	s := &script{
		links:    map[[2]string]time.Duration{{"hk", "seattle"}: 10 * ms, {"seattle", "useast"}: 10 * ms, {"hk", "useast"}: 50 * ms},
		direct:   map[string]bool{"seattle": true, "la": true, "useast": true},
		gates:    map[string]chan struct{}{"seattle": make(chan struct{})},
		honorCtx: true,
	}
	fake := testingclock.NewFakeClock(time.Now())
	ch := fastChain(v1alpha1.ModeSum)
	l := &loop{c: New(Options{Measurer: s, Clock: fake}), key: "default/c", chain: ch}
	release := func() { // seattle answers the request in flight, and holds the next
		s.mu.Lock()
		close(s.gates["seattle"])
		s.gates["seattle"] = make(chan struct{})
		s.mu.Unlock()
	}
	defer release()

	d := boundedRound(t, l)
	if !slices.Equal(d.Unmeasured, []string{"seattle"}) || route.Key(d.Route) != "hk,useast" {
		t.Fatalf("round 1: %+v", d)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for l.book.kept("seattle", fake.Now(), time.Hour) == nil {
		if time.Now().After(deadline) {
			t.Fatal("seattle's late answer was not kept")
		}
		time.Sleep(time.Millisecond)
	}
	for round := 2; round <= 3; round++ {
		d = boundedRound(t, l)
		if len(d.Unmeasured) != 0 || !slices.Equal(d.Late, []string{"seattle"}) || len(d.Candidates) == 0 || route.Key(d.Candidates[0].Relays) != "hk,seattle,useast" {
			t.Fatalf("round %d: %+v", round, d)
		}
	}
	if d.Route == nil || route.Key(d.Route) != "hk,seattle,useast" {
		t.Errorf("after two rounds in which it won: route %v", d.Route)
	}
	if n := s.asks("seattle"); n != 2 {
		t.Errorf("seattle was asked %d times; want 2 (round 1's request, then one in flight since round 2)", n)
	}
	// Past two intervals a table no longer counts.
	fake.Step(2*Interval(ch) + time.Millisecond)
	d = boundedRound(t, l)
	if !slices.Equal(d.Unmeasured, []string{"seattle"}) || len(d.Late) != 0 {
		t.Fatalf("two intervals after its last answer: %+v", d)
	}
}

// A round of a chain as wide as the CRD allows (32 via relays, maxHops 15)
// with every relay linked to every other ends, and finds the cheapest
// route: a planted one across all 15 links. Listing every route, as route
// choice did, there are about 10^19 of them, and a round of 32 via relays
// at maxHops 6 took gigabytes without ending.
func TestRoundThroughTheWidestChain(t *testing.T) {
	ch := fastChain(v1alpha1.ModeSum)
	ch.Spec.Via, ch.Spec.MaxHops = nil, 15
	for i := range 32 {
		ch.Spec.Via = append(ch.Spec.Via, fmt.Sprintf("v%02d", i))
	}
	all := append([]string{"hk", "useast"}, ch.Spec.Via...)
	s := &script{links: map[[2]string]time.Duration{}, direct: map[string]bool{}}
	for _, a := range all {
		s.direct[a] = true
		for _, b := range all {
			if a != b {
				s.links[[2]string{a, b}] = 100 * ms
			}
		}
	}
	planted := []string{"hk", "v31", "v07", "v19", "v02", "v25", "v11", "v30", "v04", "v16", "v22", "v09", "v28", "v13", "v01", "useast"}
	for i := 1; i < len(planted); i++ {
		s.links[[2]string{planted[i-1], planted[i]}] = ms
	}
	l := newLoop(s, ch)
	if d := boundedRound(t, l); route.Key(d.Route) != route.Key(planted) || d.Estimated != 15*ms {
		t.Fatalf("route %v at %v; want %v at 15ms", d.Route, d.Estimated, planted)
	}
}
