package relay

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/ratelog"
	"github.com/hoplink/hoplink/routectl"
)

// TestRelayStaysSmall: *Relay is lifecycle and wiring; roles belong in
// types of their own, so that a reader knows what each may touch.
func TestRelayStaysSmall(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, f := range pkgs["relay"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok && id.Name == "Relay" {
				methods = append(methods, fn.Name.Name)
			}
		}
	}
	if len(methods) == 0 || len(methods) > 20 {
		t.Fatalf("Relay has %d methods: %v", len(methods), methods)
	}
}

const twoRelays = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: static}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fast}
spec: {entry: hk, exit: la, mode: sum}
`

func testEnv(t *testing.T, yaml string) (*env, *metrics.Metrics) {
	t.Helper()
	set, err := manifest.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var p atomic.Pointer[manifest.Set]
	p.Store(set)
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return &env{name: "hk", log: log, warn: ratelog.New(log), m: m, set: &p,
		setupTimeout: time.Second, flows: newQuota(4, 3, 2), ctx: context.Background(), wg: &sync.WaitGroup{}}, m
}

func TestNewChecksItsConfig(t *testing.T) {
	set, _ := manifest.Parse("test.yaml", []byte(twoRelays))
	ca, _ := pki.NewCA("test")
	hk, _ := ca.Identity("hk")
	m := metrics.New(prometheus.NewRegistry())
	if _, err := New(Config{Name: "mallory", Manifests: set, Identity: hk, Metrics: m}); err == nil || !strings.Contains(err.Error(), "not defined") {
		t.Errorf("unknown relay: %v", err)
	}
	if _, err := New(Config{Name: "la", Manifests: set, Identity: hk, Metrics: m}); err == nil || !strings.Contains(err.Error(), "no certificate") {
		t.Errorf("another relay's certificate: %v", err)
	}
	r, err := New(Config{Name: "hk", Manifests: set, Identity: hk, Metrics: m})
	if err != nil || r.cfg.MaxFlows != DefaultMaxFlows || r.cfg.SetupTimeout != DefaultSetupTimeout || r.env.flows.max != DefaultMaxFlows || r.env.flows.perTunnel != DefaultMaxFlows/4 || r.env.flows.perSource != DefaultMaxFlows/64 {
		t.Fatalf("defaults: %+v (%v)", r, err)
	}
}

// TestFlowTokensAreShared: no Tunnel takes more than its share of the
// relay's flows, and no client host more than its share of a Tunnel's, so
// one of them cannot refuse everyone else (here: 4 flows, 3 a Tunnel, 2 a
// host).
func TestFlowTokensAreShared(t *testing.T) {
	e, m := testEnv(t, twoRelays)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	if !e.acquire("default/x", a) || !e.acquire("default/x", a) {
		t.Fatal("a host's first flows refused")
	}
	if e.acquire("default/x", a) {
		t.Fatal("a host took more than its share")
	}
	if !e.acquire("default/x", b) {
		t.Fatal("another host of the same Tunnel refused")
	}
	if e.acquire("default/x", netip.Addr{}) {
		t.Fatal("a Tunnel took more than its share")
	}
	if !e.acquire("default/y", netip.Addr{}) {
		t.Fatal("another Tunnel refused while the first holds its share")
	}
	if e.acquire("default/z", netip.Addr{}) {
		t.Fatal("a token past the relay's bound")
	}
	e.release("default/x", a)
	if !e.acquire("default/x", a) {
		t.Fatal("a released token was not given again")
	}
	for reason, want := range map[string]float64{"source_limit": 1} {
		if got := promtest.ToFloat64(m.FlowErrors.WithLabelValues("hk", "default/x", reason)); got != want {
			t.Errorf("%s: %v, want %v", reason, got, want)
		}
	}
	if got := promtest.ToFloat64(m.FlowErrors.WithLabelValues("hk", "default/x", "tunnel_limit")); got != 1 {
		t.Errorf("tunnel_limit: %v", got)
	}
	if got := promtest.ToFloat64(m.FlowErrors.WithLabelValues("hk", "default/z", "flow_limit")); got != 1 {
		t.Errorf("flow_limit: %v", got)
	}
}

func TestHopFailedCountsByReason(t *testing.T) {
	e, m := testEnv(t, twoRelays)
	e.hopFailed("default/t", &noRouteError{errors.New("no route yet")})
	e.hopFailed("default/t", fmt.Errorf("wrapped: %w", &nexthop.Error{Reason: nexthop.NextHop, Next: "la", Err: errors.New("down")}))
	e.hopFailed("default/t", errors.New("anything else"))
	for reason, want := range map[string]float64{"no_route": 1, "next_hop": 2} {
		if got := promtest.ToFloat64(m.FlowErrors.WithLabelValues("hk", "default/t", reason)); got != want {
			t.Errorf("%s: %v, want %v", reason, got, want)
		}
	}
}

func TestRouteBook(t *testing.T) {
	e, m := testEnv(t, twoRelays)
	set := e.manifests()
	b := newRouteBook(e, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	if rt, err := b.Route(ctx, set.Chain("default/static"), nil); err != nil || strings.Join(rt, ",") != "hk,la" {
		t.Fatalf("static route: %v %v", rt, err)
	}
	// A routed chain's new flows wait for its first decision.
	got := make(chan []string, 1)
	go func() {
		rt, _ := b.Route(ctx, set.Chain("default/fast"), nil)
		got <- rt
	}()
	select {
	case rt := <-got:
		t.Fatalf("a routed chain had route %v before any decision", rt)
	case <-time.After(50 * time.Millisecond):
	}
	b.decide(routectl.Decision{Chain: "default/fast", Route: []string{"hk", "la"}})
	if rt := <-got; strings.Join(rt, ",") != "hk,la" {
		t.Fatalf("after the decision: %v", rt)
	}
	if v := promtest.ToFloat64(m.ChainRoute.WithLabelValues("hk", "default/fast", "hk,la")); v != 1 {
		t.Fatalf("route info %v", v)
	}
	// Without the decision, waiting ends with the context.
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	b.update(set) // keeps a route the spec allows
	if _, err := b.Route(short, set.Chain("default/fast"), nil); err != nil {
		t.Fatalf("an allowed decision was forgotten: %v", err)
	}
	gone, _ := manifest.Parse("test.yaml", []byte(strings.Replace(twoRelays, "exit: la, mode: sum", "exit: hk, mode: static, route: [hk]", 1)))
	if gone == nil {
		t.Fatal("fixtures")
	}
	b.update(gone) // the chain is no longer routed: its decision goes, and its series follows
	if n := promtest.CollectAndCount(m.ChainRoute); n != 2 {
		t.Fatalf("%d route series after the chain changed, want 2 (static, fast as static)", n)
	}
	if _, ok := b.decided["default/fast"]; ok {
		t.Fatal("a decision survived its chain becoming static")
	}
}

// noLinks is a link layer that knows of no relay draining or down.
type noLinks struct{}

func (noLinks) Draining(string) bool { return false }
func (noLinks) Down(string) bool     { return false }
func (noLinks) Lost(string) bool     { return false }

// TestRouteOfSaysWhy: a flow whose Tunnel's chain left the manifests has
// no route, and says so.
func TestRouteOfSaysWhy(t *testing.T) {
	e, _ := testEnv(t, twoRelays)
	b := newRouteBook(e, true, noLinks{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	gone := &v1alpha1.Tunnel{}
	gone.Namespace, gone.Name, gone.Spec.Chain = "default", "t", "nope"
	var he *noRouteError
	if _, _, err := b.routeOf(ctx, gone); !errors.As(err, &he) || !errors.Is(err, errChainGone) {
		t.Fatalf("chain gone: %v", err)
	}
}

// stuckEnd is a trace whose asker never sends EOF: reads block until Abort.
type stuckEnd struct {
	aborted chan struct{}
	once    sync.Once
}

func (e *stuckEnd) Read([]byte) (int, error)    { <-e.aborted; return 0, errors.New("aborted") }
func (e *stuckEnd) Write(b []byte) (int, error) { return len(b), nil }
func (e *stuckEnd) Wait() error                 { return nil }
func (e *stuckEnd) CloseWrite() error           { return nil }
func (e *stuckEnd) Abort()                      { e.once.Do(func() { close(e.aborted) }) }
func (e *stuckEnd) Fail(hop.Code)               { e.Abort() }
func (e *stuckEnd) Close()                      {}

// TestTraceAtTheExitHasADeadline: a peer that opens a trace to the exit and
// never finishes it holds a flow token only until traceTimeout.
func TestTraceAtTheExitHasADeadline(t *testing.T) {
	defer func(d time.Duration) { traceTimeout = d }(traceTimeout)
	traceTimeout = 100 * time.Millisecond
	e, _ := testEnv(t, twoRelays)
	m := &measurer{env: e}
	set := e.manifests()
	done := make(chan struct{})
	in := &stuckEnd{aborted: make(chan struct{})}
	go func() {
		m.serveTrace(in, &hop.Header{Kind: hop.KindTrace, Tunnel: "default/fast", Route: []string{"hk"}}, set.Chain("default/fast"))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a trace that never ends holds its flow token")
	}
	if n := e.flows.inUse(); n != 0 {
		t.Fatalf("%d flow tokens still taken", n)
	}
}

const fourRelays = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m1}
spec: {listen: {port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: m2}
spec: {listen: {port: 7403}, endpoints: ["127.0.0.1:7403"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7404}, endpoints: ["127.0.0.1:7404"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: static}
spec: {entry: hk, exit: la, via: [m1], route: [hk, m1, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fast}
spec: {entry: hk, exit: la, via: [m1, m2], mode: sum, probe: {interval: 300ms}}
`

// TestRouteBookAvoidsDrainingRelays: a route through a relay that drains is
// not taken. A fixed route fails at once; a routed chain waits for a round
// to move, and fails after it if the route stayed.
func TestRouteBookAvoidsDrainingRelays(t *testing.T) {
	e, _ := testEnv(t, fourRelays)
	set := e.manifests()
	b := newRouteBook(e, true, nil)
	m1Drains := func(r string, _ bool) bool { return r == "m1" }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	start := time.Now()
	if _, err := b.Route(ctx, set.Chain("default/static"), m1Drains); err == nil || !strings.Contains(err.Error(), "m1") {
		t.Fatalf("a fixed route through a draining relay: %v, want an error naming m1", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond { // a round would take seconds
		t.Errorf("a fixed route through a draining relay failed after %v, want at once", d)
	}
	if rt, err := b.Route(ctx, set.Chain("default/static"), func(string, bool) bool { return false }); err != nil || strings.Join(rt, ",") != "hk,m1,la" {
		t.Fatalf("no relay drains: %v %v", rt, err)
	}
	// This relay cannot reach la itself (a link cut): that says nothing of
	// m1's link to la, so the route stands.
	laDownFromHere := func(r string, next bool) bool { return r == "la" && next }
	if rt, err := b.Route(ctx, set.Chain("default/static"), laDownFromHere); err != nil || strings.Join(rt, ",") != "hk,m1,la" {
		t.Fatalf("a relay beyond the next hop down from here: %v %v, want the route", rt, err)
	}

	b.decide(routectl.Decision{Chain: "default/fast", Route: []string{"hk", "m1", "la"}})
	got := make(chan []string, 1)
	go func() {
		rt, _ := b.Route(ctx, set.Chain("default/fast"), m1Drains)
		got <- rt
	}()
	select {
	case rt := <-got:
		t.Fatalf("a routed chain took %v through a draining relay", rt)
	case <-time.After(50 * time.Millisecond):
	}
	b.decide(routectl.Decision{Chain: "default/fast", Route: []string{"hk", "m2", "la"}})
	if rt := <-got; strings.Join(rt, ",") != "hk,m2,la" {
		t.Fatalf("after the round moved the chain: %v", rt)
	}

	// No round moves it: the flow fails after about an interval, not at
	// the end of its setup time.
	b.decide(routectl.Decision{Chain: "default/fast", Route: []string{"hk", "m1", "la"}})
	start = time.Now()
	_, err := b.Route(ctx, set.Chain("default/fast"), m1Drains)
	if d := time.Since(start); err == nil || d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("a routed chain with every route draining: %v after %v, want an error after about 300ms", err, d)
	}
}

// A relay that follows the operator's routes (in a cluster) does not wait
// for the operator when the route in status crosses a relay it knows is
// gone: it takes the best candidate of the status that avoids it, and the
// operator's route again once that is whole.
func TestRouteBookStandsInForABrokenStatusRoute(t *testing.T) {
	e, _ := testEnv(t, fourRelays)
	b := newRouteBook(e, false, nil)
	c := e.manifests().Chain("default/fast").DeepCopy()
	c.Status.Route = []string{"hk", "m1", "la"}
	c.Status.Candidates = []v1alpha1.RouteCandidate{{Route: []string{"hk", "m1", "la"}}, {Route: []string{"hk", "m2", "la"}}, {Route: []string{"hk", "la"}}}
	ctx := context.Background()
	none := func(string, bool) bool { return false }
	if rt, err := b.Route(ctx, c, none); err != nil || strings.Join(rt, ",") != "hk,m1,la" {
		t.Fatalf("a whole status route: %v %v", rt, err)
	}
	m1 := func(r string, _ bool) bool { return r == "m1" }
	if rt, err := b.Route(ctx, c, m1); err != nil || strings.Join(rt, ",") != "hk,m2,la" {
		t.Fatalf("status route through a relay that is gone: %v %v, want the next candidate hk,m2,la", rt, err)
	}
	both := func(r string, _ bool) bool { return r == "m1" || r == "m2" || r == "la" }
	start := time.Now()
	if rt, err := b.Route(ctx, c, both); err == nil || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("no candidate avoids the relays gone: %v %v after %v, want an error at once", rt, err, time.Since(start))
	}
	if rt, _ := b.Route(ctx, c, none); strings.Join(rt, ",") != "hk,m1,la" {
		t.Fatalf("once the route is whole again: %v, want the operator's", rt)
	}
}
