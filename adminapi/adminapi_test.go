package adminapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/pki"
)

// backend answers as relay `name`, records what it was asked, and refuses
// chain "default/refused" as a relay would.
type backend struct {
	name  string
	mu    sync.Mutex
	asks  []string
	big   bool
	board *Board
}

func (b *backend) record(s string) {
	b.mu.Lock()
	b.asks = append(b.asks, s)
	b.mu.Unlock()
}

func (b *backend) Links(_ context.Context, client, chain string, fresh time.Duration) (*measure.Table, error) {
	b.record(fmt.Sprintf("links %s %s %s", client, chain, fresh))
	if chain == "default/refused" {
		return nil, NotFound("not_member", errors.New("relay la is not on Chain default/refused"))
	}
	t := &measure.Table{Relay: b.name, Links: []measure.Link{{To: "useast", Up: true, RTT: measure.Duration(3 * time.Millisecond)}}}
	if b.big {
		for range 3000 {
			t.Links = append(t.Links, measure.Link{To: strings.Repeat("x", 20), Up: true})
		}
	}
	return t, nil
}

func (b *backend) Trace(_ context.Context, client, chain string, routes [][]string) ([]measure.Trace, error) {
	b.record(fmt.Sprintf("trace %s %s %v", client, chain, routes))
	out := make([]measure.Trace, len(routes))
	for i, r := range routes {
		out[i] = measure.Trace{Route: r, RTT: measure.Duration(time.Duration(i+1) * time.Millisecond)}
	}
	if chain == "default/short" {
		out = out[:1]
	}
	return out, nil
}

func (b *backend) Status(_ context.Context, client string) (*Status, error) {
	b.record("status " + client)
	return &Status{Relay: b.name, Entries: []Entry{{Tunnel: "default/web", Error: "listen tcp :80: bind: address already in use"}},
		Problems: []Problem{{Kind: ProblemDialTarget, Tunnel: "default/api", Count: 3, Last: "connection refused"}}}, nil
}

func (b *backend) ClusterSet(ctx context.Context, client, after string, wait time.Duration) ([]byte, string, error) {
	b.record("clusterset " + client + " " + after)
	if client != pki.OperatorName {
		return nil, "", NotFound("not_operator", fmt.Errorf("%q may not", client))
	}
	if b.board == nil {
		return nil, "", nil
	}
	data, version, _ := b.board.Get(ctx, after, wait)
	return data, version, nil
}

// server serves Handler(b) over TLS as the relay `as`, the way a relay's
// TLS endpoint does: mutual TLS with the admin protocol, then plain
// HTTP/1.1 on the connection, with the client's proven name recorded.
func server(t *testing.T, ca *pki.CA, as string, b Backend) string {
	t.Helper()
	id, err := ca.Identity(as)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &handshaken{Listener: tls.NewListener(raw, id.ServerConfig(nil, pki.AdminALPN))}
	srv := &http.Server{Handler: Handler(b), ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		return WithClient(ctx, c.(plainConn).client)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return raw.Addr().String()
}

type handshaken struct{ net.Listener }

type plainConn struct {
	net.Conn
	client string
}

func (l *handshaken) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := c.(*tls.Conn)
		if tc.Handshake() != nil {
			tc.Close()
			continue
		}
		name, _ := pki.PeerName(tc.ConnectionState())
		return plainConn{tc, name}, nil
	}
}

func operator(t *testing.T, ca *pki.CA) *Client {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cert, err := ca.IssueOperator(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return NewClient(roots, func() (*tls.Certificate, error) { return &cert, nil })
}

func TestLinksAndTrace(t *testing.T) {
	ca, _ := pki.NewCA("test")
	b := &backend{name: "la"}
	ep := server(t, ca, "la", b)
	c := operator(t, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	table, err := c.Links(ctx, "la", ep, "default/fast", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if table.Relay != "la" || len(table.Links) != 1 || table.Links[0].RTT.D() != 3*time.Millisecond {
		t.Fatalf("table %+v", table)
	}
	routes := [][]string{{"hk", "useast"}, {"hk", "la", "useast"}}
	traces, err := c.Trace(ctx, "la", ep, "default/fast", routes)
	if err != nil {
		t.Fatal(err)
	}
	if len(traces) != 2 || traces[1].RTT.D() != 2*time.Millisecond || traces[1].Route[1] != "la" {
		t.Fatalf("traces %+v", traces)
	}
	st, err := c.Status(ctx, "la", ep)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Entries) != 1 || st.Entries[0].Open || !strings.Contains(st.Entries[0].Error, "in use") || len(st.Problems) != 1 || st.Problems[0].Count != 3 {
		t.Fatalf("status %+v", st)
	}
	if _, err := c.Status(ctx, "hk", ep); err == nil || !strings.Contains(err.Error(), "not hk") {
		t.Fatalf("status asked of hk at la's address: %v", err)
	}
	want := []string{
		"links " + pki.OperatorName + " default/fast 500ms",
		"trace " + pki.OperatorName + " default/fast [[hk useast] [hk la useast]]",
		"status " + pki.OperatorName,
	}
	if strings.Join(b.asks, "\n") != strings.Join(want, "\n") {
		t.Fatalf("backend was asked:\n%s\nwant:\n%s", strings.Join(b.asks, "\n"), strings.Join(want, "\n"))
	}
}

func TestRefusalsAndLimits(t *testing.T) {
	ca, _ := pki.NewCA("test")
	b := &backend{name: "la"}
	ep := server(t, ca, "la", b)
	c := operator(t, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := c.Links(ctx, "la", ep, "default/refused", time.Second)
	var e *Error
	if !errors.As(err, &e) || e.Reason != "not_member" || e.Status != http.StatusNotFound || !strings.Contains(e.Msg, "not on Chain") {
		t.Fatalf("refusal came back as %v", err)
	}
	if _, err := c.Trace(ctx, "la", ep, "default/fast", make([][]string, MaxTraceRoutes+1)); !errors.As(err, &e) || e.Reason != "bad_body" {
		t.Fatalf("%d routes: %v", MaxTraceRoutes+1, err)
	}
	if _, err := c.Trace(ctx, "la", ep, "default/short", [][]string{{"hk", "la"}, {"hk", "x", "la"}}); err == nil || !strings.Contains(err.Error(), "1 traces for 2 routes") {
		t.Fatalf("short answer: %v", err)
	}
	// A client that asks with a bad duration, by hand.
	resp, err := c.http("la").Get("https://" + ep + PathLinks + "?chain=default/fast&fresh=soon")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("fresh=soon: %s", resp.Status)
	}
	b.big = true
	if _, err := c.Links(ctx, "la", ep, "default/fast", time.Second); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized answer: %v", err)
	}
}

// TestClientChecksTheRelay: the operator talks only to the relay it named.
func TestClientChecksTheRelay(t *testing.T) {
	ca, _ := pki.NewCA("test")
	ep := server(t, ca, "seattle", &backend{name: "seattle"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := operator(t, ca).Links(ctx, "la", ep, "default/fast", time.Second); err == nil {
		t.Fatal("a relay with another name answered for la")
	}
	impostor := server(t, ca, "la", &backend{name: "seattle"})
	if _, err := operator(t, ca).Links(ctx, "la", impostor, "default/fast", time.Second); err == nil || !strings.Contains(err.Error(), `as relay "seattle"`) {
		t.Fatalf("a table of another relay was taken: %v", err)
	}
}

// hostile answers with control sequences in every string a relay supplies.
type hostile struct{ backend }

const escapes = "\x1b]0;pwned\x07\x1b[2J\x1b[H\nready: every relay answers\u202e"

func (h *hostile) Status(context.Context, string) (*Status, error) {
	return &Status{Relay: h.name, Version: escapes,
		Entries:  []Entry{{Tunnel: "default/web" + escapes, Error: escapes}},
		Problems: []Problem{{Kind: ProblemDialTarget, Tunnel: "default/api", Last: escapes}},
		Chains:   []ChainRoute{{Chain: "default/c", Route: []string{"la", escapes}, Reason: escapes}}}, nil
}

func (h *hostile) Links(context.Context, string, string, time.Duration) (*measure.Table, error) {
	return nil, NotFound("not_member"+escapes, errors.New(escapes))
}

// TestAnswersArePrintable: what a relay answers reaches terminals (hoplink
// status) and conditions and Events (the operator) as printable text, a
// refusal's words too. Before, every escape went through as sent.
func TestAnswersArePrintable(t *testing.T) {
	ca, _ := pki.NewCA("test")
	ep := server(t, ca, "la", &hostile{backend{name: "la"}})
	c := operator(t, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Status(ctx, "la", ep)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []string{s.Version, s.Entries[0].Tunnel, s.Entries[0].Error, s.Problems[0].Last, s.Chains[0].Route[1], s.Chains[0].Reason} {
		if strings.ContainsAny(got, "\x1b\x07\n\u202e") || !strings.Contains(got, `\x1b]0;pwned\x07`) {
			t.Errorf("answer %q is not printable, or not escaped", got)
		}
	}
	_, err = c.Links(ctx, "la", ep, "default/c", time.Second)
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\x07\n\u202e") {
		t.Errorf("refusal %q", err)
	}
}
