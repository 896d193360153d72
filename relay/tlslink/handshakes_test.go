package tlslink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/srcaddr"
)

// Which handshake gives way to a new one: table of the handshakes in
// progress (source, known, age), the new one's source and standing, and
// the one closed (-1: none; len: the new one itself is refused).
func TestHandshakeGivesWay(t *testing.T) {
	type hs struct {
		src   string
		known bool
		age   time.Duration
	}
	for _, tc := range []struct {
		name     string
		max, per int
		table    []hs
		src      string
		known    bool
		want     int
	}{
		{"room", 4, 4, []hs{{"10.0.0.1", false, 0}}, "10.0.0.2", false, -1},
		{"the heaviest source's oldest", 3, 4, []hs{{"10.0.0.1", false, time.Second}, {"10.0.0.1", false, 2 * time.Second}, {"10.0.0.2", false, time.Hour}}, "10.0.0.3", false, 1},
		{"one's own oldest past its share", 8, 2, []hs{{"10.0.0.1", false, time.Second}, {"10.0.0.1", false, time.Minute}, {"10.0.0.2", false, time.Hour}}, "10.0.0.1", false, 1},
		{"an IPv6 /64 is one source", 3, 2, []hs{{"2001:db8::1", false, time.Second}, {"2001:db8::2", false, time.Minute}, {"10.0.0.2", false, time.Hour}}, "2001:db8::3", false, 1},
		{"neighbouring /64s are two", 3, 2, []hs{{"2001:db8:0:1::1", false, time.Second}, {"2001:db8:0:2::1", false, time.Minute}, {"10.0.0.2", false, time.Hour}}, "2001:db8:0:3::1", false, 2},
		{"an unknown one never closes a known one", 2, 4, []hs{{"10.0.0.1", true, time.Hour}, {"10.0.0.1", true, time.Hour}}, "10.0.0.2", false, 2},
		{"... but takes the unknown ones' place", 3, 4, []hs{{"10.0.0.1", true, time.Hour}, {"10.0.0.1", true, time.Hour}, {"10.0.0.3", false, 0}}, "10.0.0.2", false, 2},
		{"a known one closes an unknown one first", 3, 4, []hs{{"10.0.0.1", true, time.Hour}, {"10.0.0.1", true, time.Hour}, {"10.0.0.3", false, 0}}, "10.0.0.4", true, 2},
		{"known among known: the heaviest's oldest", 3, 4, []hs{{"10.0.0.1", true, time.Second}, {"10.0.0.1", true, time.Minute}, {"10.0.0.5", true, time.Hour}}, "10.0.0.4", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			h := newHandshakes(tc.max, tc.per)
			conns := map[net.Conn]int{}
			for i, x := range tc.table {
				c, _ := net.Pipe()
				src := srcaddr.Key(netip.MustParseAddr(x.src))
				h.conns[c] = &handshake{src: src, known: x.known, since: now.Add(-x.age)}
				h.bySrc[src]++
				conns[c] = i
			}
			src := srcaddr.Key(netip.MustParseAddr(tc.src))
			if tc.known {
				h.learn(src, now)
			}
			c, _ := net.Pipe()
			conns[c] = len(tc.table)
			got := -1
			if v := h.start(c, src, now); v != nil {
				got = conns[v]
			}
			if got != tc.want {
				t.Fatalf("closes %d, want %d", got, tc.want)
			}
			want := len(tc.table) + 1
			if got >= 0 {
				want--
			}
			if n := h.inProgress(); n != want {
				t.Fatalf("%d in progress, want %d", n, want)
			}
		})
	}
}

// A source is known for knownFor after it authenticated, then no longer.
func TestKnownSourcesExpire(t *testing.T) {
	h := newHandshakes(1, 1)
	now := time.Now()
	src := srcaddr.Key(netip.MustParseAddr("10.0.0.1"))
	h.learn(src, now)
	a, _ := net.Pipe()
	h.start(a, netip.Prefix{}, now) // an unknown one holds the place
	b, _ := net.Pipe()
	if v := h.start(b, src, now.Add(knownFor-time.Second)); v != a {
		t.Fatal("a known source did not take an unknown one's place")
	}
	c, _ := net.Pipe()
	if v := h.start(c, netip.MustParsePrefix("10.0.0.2/32"), now.Add(knownFor+time.Second)); v != c {
		t.Fatalf("an unknown source took a known one's place: %v", v)
	}
	h.conns[b].known = false // as a handshake started after knownFor would be
	d, _ := net.Pipe()
	if v := h.start(d, netip.MustParsePrefix("10.0.0.3/32"), now.Add(knownFor+time.Second)); v != b {
		t.Fatal("a source past knownFor kept its standing")
	}
}

// flood holds n silent TCP connections to addr from the loopback address
// from, each re-opened 200 ms after the relay closes it, until stop.
func flood(t *testing.T, from, addr string, n int, stop <-chan struct{}, wg *sync.WaitGroup) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Second}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := d.Dial("tcp", addr)
				if err == nil {
					go func() { <-stop; c.Close() }()
					io.Copy(io.Discard, c) // until the relay closes it
					c.Close()
				}
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
}

// TestHandshakeFloodLeavesPeersAndAdminIn: three hosts hold 64 silent
// connections each to relay b's TLS port, re-opening each the relay
// closes. A peer b has never seen still gets TLS flows through, the
// operator still reaches the admin API (the port is shared), and so they
// do again once known. Before, two such hosts took all 128 places and
// every other handshake was refused.
func TestHandshakeFloodLeavesPeersAndAdminIn(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	got := make(chan accepted, 8)
	b := endpoint(t, ca, "b", m, got)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for _, from := range []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"} {
		flood(t, from, b.Addr().String(), MaxHandshakesPerSource, stop, &wg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.handshakes.inProgress() < MaxHandshakes {
		if time.Now().After(deadline) {
			t.Fatalf("the flood holds %d places after 10 s, want all %d", b.handshakes.inProgress(), MaxHandshakes)
		}
		time.Sleep(10 * time.Millisecond)
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	op, _ := ca.IssueOperator(time.Hour)
	admin := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}).DialContext,
		TLSClientConfig: pki.AdminClientConfig(roots, func() (*tls.Certificate, error) { return &op, nil }, "b"), DisableKeepAlives: true}}
	a := endpoint(t, ca, "a", m, make(chan accepted, 1))
	p := a.Pools().Pool("b", []string{b.Addr().String()})
	for round := range 2 { // unknown to b, then known
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := p.Get(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: a's TLS link to b under the flood: %v", round, err)
		}
		fmt.Fprintf(c, "flow%d", round)
		select {
		case r := <-got:
			if r != (accepted{"a", fmt.Sprintf("flow%d", round)}) {
				t.Fatalf("b accepted %+v", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: a's flow was not served under the flood", round)
		}
		c.Close()
		a.Done(c)
		resp, err := admin.Get("https://" + b.Addr().String() + "/")
		if err != nil {
			t.Fatalf("round %d: the operator's admin call under the flood: %v", round, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello "+pki.OperatorName {
			t.Fatalf("round %d: admin answered %q", round, body)
		}
	}
	if n := b.handshakes.inProgress(); n > MaxHandshakes {
		t.Fatalf("%d handshakes in progress, more than %d", n, MaxHandshakes)
	}
}
