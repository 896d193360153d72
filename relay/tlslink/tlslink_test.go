package tlslink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

type accepted struct {
	peer string
	line string
}

// serveFunc is an Upper that serves connections with itself and ignores
// refused handshakes.
type serveFunc func(peer string, c *tls.Conn)

func (f serveFunc) Serve(peer string, c *tls.Conn) { f(peer, c) }

func (serveFunc) Rejected(net.Addr, error) {}

func endpoint(t *testing.T, ca *pki.CA, name string, m *metrics.Metrics, got chan<- accepted) *Endpoint {
	t.Helper()
	id, err := ca.Identity(name)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Listen(Options{
		Name: name, Identity: id, Listen: "127.0.0.1:0", Spares: 2,
		Peers: []string{"a", "b"},
		Upper: serveFunc(func(peer string, c *tls.Conn) {
			defer c.Close()
			b := make([]byte, 5)
			n, _ := io.ReadFull(c, b)
			got <- accepted{peer, string(b[:n])}
		}),
		Admin: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s", adminapi.ClientOf(r.Context()))
		}),
		Metrics: m, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// endpoints makes relays a and b, who know each other, under one CA; what
// b accepts comes on got, which holds buffer.
func endpoints(t *testing.T, buffer int) (a, b *Endpoint, got chan accepted) {
	t.Helper()
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	got = make(chan accepted, buffer)
	b = endpoint(t, ca, "b", m, got)
	a = endpoint(t, ca, "a", m, got)
	return a, b, got
}

func TestPoolCarriesFlowsAndRefills(t *testing.T) {
	a, b, got := endpoints(t, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := a.Pools().Pool("b", []string{b.Addr().String()})
	for i := range 3 {
		c, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "flow%d", i)
		if r := <-got; r.peer != "a" || r.line != fmt.Sprintf("flow%d", i) {
			t.Fatalf("b accepted %+v", r)
		}
		c.Close()
		a.Done(c)
	}
	// The pool keeps its spares ready for the next flows: as many as its
	// flows took lately, above its base of 2.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.spares)
		p.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares, want 3", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestUnknownPeersAndAdminCallers(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	got := make(chan accepted, 8)
	b := endpoint(t, ca, "b", m, got)

	// A relay no manifest names is turned away after its handshake.
	mallory, _ := ca.Identity("mallory")
	c, err := tls.Dial("tcp", b.Addr().String(), mallory.ClientConfig("b"))
	if err == nil {
		c.Write([]byte("hello"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("mallory's connection stayed open")
		}
		c.Close()
	}
	select {
	case r := <-got:
		t.Fatalf("a flow from an unknown relay was served: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	if v := promtest.ToFloat64(m.Handshakes.WithLabelValues("b", "accept", "rejected")); v < 1 {
		t.Fatalf("rejected handshakes %v", v)
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	admin := func(cert tls.Certificate) (string, error) {
		cl := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.AdminClientConfig(roots, func() (*tls.Certificate, error) { return &cert, nil }, "b")}}
		resp, err := cl.Get("https://" + b.Addr().String() + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	op, _ := ca.IssueOperator(time.Hour)
	if body, err := admin(op); err != nil || body != "hello "+pki.OperatorName {
		t.Fatalf("operator: %q %v", body, err)
	}
	a, _ := ca.Identity("a")
	if body, err := admin(*a.Certificate()); err == nil && strings.Contains(body, "hello") {
		t.Fatalf("a relay's certificate reached the admin API: %q", body)
	}
}

// TestWaitingConnectionsAreBounded: peer a handshakes 40 connections and
// sends nothing on them. The listener keeps a's newest 8 (its share here)
// and closes the older ones, each counted; a's next flow is served; c's
// spares and c's open flow, and a third peer filling the total, cost no
// one else's connection: past the total the peer that holds the most gives
// way. Without the bound all 40 stayed open for 45 s each.
func TestWaitingConnectionsAreBounded(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	id, _ := ca.Identity("b")
	var self atomic.Pointer[Endpoint]
	got := make(chan accepted, 8)
	b, err := Listen(Options{
		Name: "b", Identity: id, Listen: "127.0.0.1:0",
		Peers: []string{"a", "c", "d"},
		Upper: serveFunc(func(peer string, c *tls.Conn) {
			defer c.Close()
			h := make([]byte, 5)
			if _, err := io.ReadFull(c, h); err != nil {
				return
			}
			self.Load().Started(c)
			c.SetReadDeadline(time.Time{})
			got <- accepted{peer, string(h)}
			io.Copy(io.Discard, c) // the flow, until its peer ends it
		}),
		Metrics: m, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	self.Store(b)
	b.waiting.mu.Lock()
	b.waiting.perPeer, b.waiting.max = 8, 20
	b.waiting.mu.Unlock()

	closedByB := closedWaiting(m, "b")
	waiting := func(peer string) int {
		b.waiting.mu.Lock()
		defer b.waiting.mu.Unlock()
		return len(b.waiting.conns[peer])
	}
	var all []*tls.Conn
	t.Cleanup(func() {
		for _, c := range all {
			c.Close()
		}
	})
	// dial handshakes a connection of peer and waits until b counts it:
	// as waiting (want its peer's count) or, past a bound, as closing
	// another (want the count of closed ones).
	dial := func(peer string, wantWaiting int, wantClosed float64) *tls.Conn {
		t.Helper()
		pid, _ := ca.Identity(peer)
		c, err := tls.Dial("tcp", b.Addr().String(), pid.ClientConfig("b"))
		if err != nil {
			t.Fatalf("%s: %v", peer, err)
		}
		all = append(all, c)
		deadline := time.Now().Add(5 * time.Second)
		for waiting(peer) != wantWaiting || closedByB() != wantClosed {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d waiting, %v closed; want %d, %v", peer, waiting(peer), closedByB(), wantWaiting, wantClosed)
			}
			time.Sleep(time.Millisecond)
		}
		return c
	}
	// open reports whether b keeps c open: a read sees nothing for a while.
	open := func(c *tls.Conn, wait time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(wait))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}

	// c: a flow under way, and 4 spares.
	pid, _ := ca.Identity("c")
	flow, err := tls.Dial("tcp", b.Addr().String(), pid.ClientConfig("b"))
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, flow)
	flow.Write([]byte("flowc"))
	if r := <-got; r != (accepted{"c", "flowc"}) {
		t.Fatalf("accepted %+v", r)
	}
	var spares []*tls.Conn
	for i := range 4 {
		spares = append(spares, dial("c", i+1, 0))
	}
	// a floods.
	var flood []*tls.Conn
	for i := range 40 {
		flood = append(flood, dial("a", min(i+1, 8), float64(max(0, i+1-8))))
	}
	for i, c := range flood {
		if keep := i >= 32; open(c, 50*time.Millisecond) != keep {
			t.Fatalf("a's connection %d of 40: open %v, want %v", i, !keep, keep)
		}
	}
	// d takes the total's last 8 places, then gives way to itself: it
	// holds as many as a, and the newcomer's peer goes first on a tie.
	var dconns []*tls.Conn
	for i := range 10 {
		dconns = append(dconns, dial("d", min(i+1, 8), float64(32+max(0, i+1-8))))
	}
	if a := waiting("a"); a != 8 {
		t.Fatalf("a has %d waiting after d filled the total, want 8", a)
	}
	for i, c := range dconns {
		if keep := i >= 2; open(c, 50*time.Millisecond) != keep {
			t.Fatalf("d's connection %d of 10: open %v, want %v", i, !keep, keep)
		}
	}
	for i, c := range append(spares, flow) {
		if !open(c, 50*time.Millisecond) {
			t.Fatalf("c's connection %d was closed", i)
		}
	}
	// a's next flow is served, at the cost of a's oldest waiting one.
	next := dial("a", 8, 35)
	next.Write([]byte("flowa"))
	select {
	case r := <-got:
		if r != (accepted{"a", "flowa"}) {
			t.Fatalf("accepted %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a's flow after its flood was not served")
	}
	if open(flood[32], 2*time.Second) {
		t.Fatal("a's oldest waiting connection stayed open past a's share")
	}
	if w := waiting("a"); w != 7 {
		t.Fatalf("a has %d waiting after its flow started, want 7", w)
	}
}

// closedWaiting reads how many connections relay closed to make room for
// others waiting for their header.
func closedWaiting(m *metrics.Metrics, relay string) func() float64 {
	return func() float64 { return promtest.ToFloat64(m.Rejected.WithLabelValues(relay, "header_limit")) }
}
