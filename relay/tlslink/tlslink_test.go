package tlslink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
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

func endpoint(t *testing.T, ca *pki.CA, name string, m *metrics.Metrics, got chan<- accepted) *Endpoint {
	t.Helper()
	id, err := ca.Identity(name)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Listen(Options{
		Name: name, Identity: id, Listen: "127.0.0.1:0", Spares: 2,
		KnownPeer: func(n string) bool { return n == "a" || n == "b" },
		Handler: func(peer string, c *tls.Conn) {
			defer c.Close()
			b := make([]byte, 5)
			n, _ := io.ReadFull(c, b)
			got <- accepted{peer, string(b[:n])}
		},
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

func TestPoolCarriesFlowsAndRefills(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	got := make(chan accepted, 8)
	b := endpoint(t, ca, "b", m, got)
	a := endpoint(t, ca, "a", m, got)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := a.Pool("b", []string{b.Addr().String()})
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
	// The pool keeps its spares ready for the next flows.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.spares)
		p.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares, want 2", n)
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
