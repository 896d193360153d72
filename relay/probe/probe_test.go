package probe

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay/egress"
)

// echoer answers probes after a delay, dropping every dropEvery-th one; it
// stands in for a peer's QUIC connection so the statistics can be checked
// against known delays. The relay tests probe real connections.
type echoer struct {
	l         *Links
	peer      string
	delay     atomic.Int64
	dropEvery int
	sent      atomic.Int64
}

func (e *echoer) SendProbe(p []byte) error {
	n := e.sent.Add(1)
	if e.dropEvery > 0 && n%int64(e.dropEvery) == 0 {
		return nil
	}
	payload := append([]byte(nil), p...)
	time.AfterFunc(time.Duration(e.delay.Load()), func() { e.l.Echo(e.peer, payload) })
	return nil
}

func (e *echoer) SmoothedRTT() time.Duration { return time.Duration(e.delay.Load()) }

// testPeers is the link layer of a test's prober: its echoers, and what
// it hears of answers.
type testPeers struct {
	senders  map[string]*echoer
	answered func(peer string, ok bool)
}

func (p *testPeers) Sender(peer string) Sender {
	if s := p.senders[peer]; s != nil {
		return s
	}
	return nil
}

func (p *testPeers) Answered(peer string, ok bool) {
	if p.answered != nil {
		p.answered(peer, ok)
	}
}

func newProber(t *testing.T, senders map[string]*echoer) (*Links, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	l := NewLinks(LinkOptions{Relay: "hk", Metrics: m, Peers: &testPeers{senders: senders}})
	for name, s := range senders {
		s.l, s.peer = l, name
	}
	return l, m
}

func TestLinksMeasure(t *testing.T) {
	la := &echoer{}
	la.delay.Store(int64(30 * time.Millisecond))
	lossy := &echoer{dropEvery: 5}
	lossy.delay.Store(int64(10 * time.Millisecond))
	l, m := newProber(t, map[string]*echoer{"la": la, "lossy": lossy})

	// A round waits for every answer until its context ends: the lossy
	// link's dropped probe holds this one for the whole 300 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	links := l.Measure(ctx, []string{"la", "lossy", "gone"}, 0)
	// At least the echo's 30 ms, and below the 80 ms the next round sets
	// (a busy host delays timers, never hastens them).
	if got := links[0]; !got.Up || got.RTT.D() < 30*time.Millisecond || got.RTT.D() >= 80*time.Millisecond || got.Loss != 0 {
		t.Errorf("la: %+v; want up, RTT 30-80 ms, no loss", got)
	}
	if got := links[1]; !got.Up || got.Loss != 0.2 {
		t.Errorf("lossy: %+v; want up with loss 0.2 (one probe of five dropped)", got)
	}
	if got := links[2]; got.Up || got.To != "gone" {
		t.Errorf("a peer without a connection: %+v; want down", got)
	}
	if v := testutil.ToFloat64(m.LinkRTT.WithLabelValues("hk", "la")); v < 0.030 || v >= 0.080 {
		t.Errorf("hoplink_link_rtt_seconds{from=hk,to=la} = %v", v)
	}
	if v := testutil.ToFloat64(m.LinkProbes.WithLabelValues("hk", "lossy", "lost")); v != 1 {
		t.Errorf("lost probes counted %v, want 1", v)
	}

	// The next round follows a change at once; the recent minimum keeps the
	// old, lower figure.
	la.delay.Store(int64(80 * time.Millisecond))
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	got := l.Measure(ctx2, []string{"la"}, 0)[0]
	if got.RTT.D() < 80*time.Millisecond || got.Min.D() >= 80*time.Millisecond {
		t.Errorf("after the delay rose to 80 ms: %+v; want RTT >= 80 ms and the older min", got)
	}
}

func TestLinksCoalesce(t *testing.T) {
	la := &echoer{}
	la.delay.Store(int64(20 * time.Millisecond))
	l, _ := newProber(t, map[string]*echoer{"la": la})
	ctx := context.Background()

	// Ten callers at once share one round.
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); l.Measure(ctx, []string{"la"}, time.Second) }()
	}
	wg.Wait()
	if n := la.sent.Load(); n != DefaultProbes {
		t.Fatalf("10 concurrent callers sent %d probes; want one round of %d", n, DefaultProbes)
	}
	// A fresh enough result is reused, with its age.
	got := l.Measure(ctx, []string{"la"}, time.Second)[0]
	if la.sent.Load() != DefaultProbes || got.Age.D() <= 0 {
		t.Fatalf("reuse within fresh: %d probes, age %v", la.sent.Load(), got.Age)
	}
	// Past fresh, a new round runs.
	l.Measure(ctx, []string{"la"}, time.Nanosecond)
	if la.sent.Load() != 2*DefaultProbes {
		t.Fatalf("past fresh: %d probes, want a second round", la.sent.Load())
	}
}

func TestLinksTimeoutCountsLoss(t *testing.T) {
	slow := &echoer{}
	slow.delay.Store(int64(time.Second))
	l, _ := newProber(t, map[string]*echoer{"slow": slow})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := l.Measure(ctx, []string{"slow"}, 0)[0]
	if got.Up || got.Loss != 1 {
		t.Fatalf("no answer within the round: %+v; want down with loss 1", got)
	}
	l.Retain(nil)
	if len(l.last.retain(func(string) bool { return true })) != 0 {
		t.Fatal("Retain(nil) kept a peer")
	}
}

func TestTargets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()

	m := metrics.New(prometheus.NewRegistry())
	tp := NewTargets("la", m, nil)
	up := TargetSpec{Tunnel: "default/web", Target: ln.Addr().String()}
	down := TargetSpec{Tunnel: "default/gone", Target: closedAddr}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got := tp.Measure(ctx, []TargetSpec{up, down}, time.Minute)
	if !got[0].Up || got[0].RTT <= 0 || got[1].Up || !strings.Contains(got[1].Error, "connection refused") {
		t.Fatalf("targets: %+v", got)
	}
	// Probes connect as the exit's flows do: what the exit's egress
	// policy refuses is down, whatever listens there.
	refusing := NewTargets("la", nil, egress.NodePolicy().Dialer())
	if r := refusing.Measure(ctx, []TargetSpec{up}, 0)[0]; r.Up || !strings.Contains(r.Error, "egress refused") {
		t.Errorf("a loopback target through the node's egress policy: %+v", r)
	}
	if v := testutil.ToFloat64(m.TargetUp.WithLabelValues("la", "default/gone", closedAddr)); v != 0 {
		t.Errorf("hoplink_target_up of a closed port = %v", v)
	}
	// A real flow's connect time stands in for a probe.
	tp.Observe(up, 7*time.Millisecond)
	if got := tp.Measure(ctx, []TargetSpec{up}, time.Minute)[0]; got.RTT.D() != 7*time.Millisecond {
		t.Errorf("after Observe(7ms): %+v", got)
	}
	waitAccepted := time.Now().Add(time.Second)
	for accepted.Load() != 1 && time.Now().Before(waitAccepted) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("target saw %d probe connections, want 1 (the second measure reuses the observed flow)", n)
	}
	tp.Retain([]TargetSpec{up})
	if n := testutil.CollectAndCount(m.TargetUp); n != 1 {
		t.Errorf("after Retain, %d target series remain; want 1", n)
	}
}

// Answered hears each round that sent probes: whether the peer answered
// any. A peer without a connection sends none, and is not reported.
func TestLinksReportSilentPeers(t *testing.T) {
	quick, dead := &echoer{}, &echoer{}
	dead.delay.Store(int64(time.Hour))
	l, _ := newProber(t, map[string]*echoer{"quick": quick, "dead": dead})
	heard := map[string]bool{}
	var mu sync.Mutex
	l.o.Peers.(*testPeers).answered = func(peer string, ok bool) {
		mu.Lock()
		heard[peer] = ok
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	l.Measure(ctx, []string{"quick", "dead", "unconnected"}, 0)
	mu.Lock()
	defer mu.Unlock()
	if ok, seen := heard["quick"]; !seen || !ok {
		t.Errorf("quick: heard %v, %v; want answered", ok, seen)
	}
	if ok, seen := heard["dead"]; !seen || ok {
		t.Errorf("dead: heard %v, %v; want silent", ok, seen)
	}
	if _, seen := heard["unconnected"]; seen {
		t.Error("a peer without a connection was reported")
	}
}

// A peer that answers after the round stopped waiting (a busy host) is not
// left down: its late answer makes the link up at that round trip, and the
// peer answering, until the next round; a table asked for meanwhile takes
// it without probing again. A round forgets the probes of the one before
// that still wait for answers, so they stay bounded.
func TestLateEchoesCount(t *testing.T) {
	la := &echoer{}
	la.delay.Store(int64(150 * time.Millisecond))
	var mu sync.Mutex
	var answered []bool
	l, _ := newProber(t, map[string]*echoer{"la": la})
	l.o.Peers.(*testPeers).answered = func(peer string, ok bool) {
		mu.Lock()
		answered = append(answered, ok)
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if got := l.Measure(ctx, []string{"la"}, time.Minute)[0]; got.Up {
		t.Fatalf("answers in 150 ms, waited 20 ms: %+v; want down", got)
	}
	sent := la.sent.Load()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(answered)
		last := answered[n-1]
		mu.Unlock()
		if n >= 2 && last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("answered %v after the late echoes; want [false true]", answered)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := l.Measure(context.Background(), []string{"la"}, time.Minute)[0]
	if !got.Up || got.RTT.D() < 150*time.Millisecond || la.sent.Load() != sent {
		t.Errorf("after the late answers: %+v, %d probes sent after %d; want up at >= 150 ms, no new round", got, la.sent.Load(), sent)
	}
	if got.Loss >= 1 {
		t.Errorf("loss %v counts the late answers as lost", got.Loss)
	}
	mu.Lock()
	if len(answered) != 2 {
		t.Errorf("answered %v; want one round's verdict, then one correction", answered)
	}
	mu.Unlock()

	la.delay.Store(int64(10 * time.Second))
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		l.Measure(ctx, []string{"la"}, 0)
		cancel()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.waiting); n > DefaultProbes {
		t.Errorf("%d probes wait for answers after 5 unanswered rounds; want the last round's at most", n)
	}
}

// swapPeers is a link layer whose connection to "la" a test replaces.
type swapPeers struct {
	mu       sync.Mutex
	s        Sender
	answered []bool
}

func (p *swapPeers) Sender(string) Sender { p.mu.Lock(); defer p.mu.Unlock(); return p.s }
func (p *swapPeers) Answered(_ string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answered = append(p.answered, ok)
}

// TestRoundOverAReplacedConnection: a round whose probes went unanswered
// over a connection replaced meanwhile (the peer came back) tells the
// link layer nothing, which would count the new connection's peer down;
// over the same connection it tells that the peer did not answer.
func TestRoundOverAReplacedConnection(t *testing.T) {
	p := &swapPeers{s: &echoer{dropEvery: 1}} // answers nothing
	l := NewLinks(LinkOptions{Relay: "hk", Peers: p})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	time.AfterFunc(100*time.Millisecond, func() { p.mu.Lock(); p.s = &echoer{dropEvery: 1}; p.mu.Unlock() })
	l.Measure(ctx, []string{"la"}, 0)
	p.mu.Lock()
	if len(p.answered) != 0 {
		t.Errorf("a round over a replaced connection said %v", p.answered)
	}
	p.mu.Unlock()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	l.Measure(ctx2, []string{"la"}, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.answered) != 1 || p.answered[0] {
		t.Errorf("a silent round over the same connection said %v, want [false]", p.answered)
	}
}
