package quic

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

func testEndpoint(t *testing.T, ca *pki.CA, name string, accepted chan<- *Conn) *Endpoint {
	return testEndpointWith(t, ca, name, func(c *Conn, s *quicgo.Stream) {
		s.CancelRead(0)
		s.Close()
		accepted <- c
	})
}

// testUpper is the layer above a test's endpoint: streams go to serve,
// and the events a test listens for to its funcs.
type testUpper struct {
	serve    func(*Conn, *quicgo.Stream)
	draining func(peer string)
	echo     func(peer string, payload []byte)
}

func (u *testUpper) Serve(c *Conn, s *quicgo.Stream) { u.serve(c, s) }

func (u *testUpper) Event(e Event) {
	switch {
	case e.Kind == PeerDraining && u.draining != nil:
		u.draining(e.Peer)
	case e.Kind == ProbeEcho && u.echo != nil:
		u.echo(e.Peer, e.Payload)
	}
}

// upperOf is a test endpoint's testUpper.
func upperOf(e *Endpoint) *testUpper { return e.opts.Upper.(*testUpper) }

// testPeers are the relays the tests' endpoints take, each with the
// default bound on its connections.
var testPeers = map[string]int{"a": 0, "b": 0, "c": 0, "d": 0}

// testEndpointWith starts an endpoint whose peers' streams go to handler.
func testEndpointWith(t *testing.T, ca *pki.CA, name string, handler func(*Conn, *quicgo.Stream)) *Endpoint {
	t.Helper()
	return testEndpointOpts(t, ca, name, handler, nil)
}

// testEndpointOpts is testEndpointWith with options changed by edit.
func testEndpointOpts(t *testing.T, ca *pki.CA, name string, handler func(*Conn, *quicgo.Stream), edit func(*Options)) *Endpoint {
	t.Helper()
	id, err := ca.Identity(name)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Name: name, Identity: id, Listen: "127.0.0.1:0",
		Peers:   testPeers,
		Upper:   &testUpper{serve: handler},
		Metrics: metrics.New(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil))}
	if edit != nil {
		edit(&o)
	}
	e, err := Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// A datagram as large as MaxDatagram says must arrive, at every size path
// MTU discovery passes through: quic-go accepts a datagram by an estimate
// that assumes connection IDs of a given length, and drops it when sending
// if the packet has less room than that (as it did with 20-byte IDs).
func TestLargestDatagramArrives(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 1)
	a, b := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", accepted)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream shows b's side of the connection.
	s, err := c.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{0})
	var far *Conn
	select {
	case far = <-accepted:
	case <-ctx.Done():
		t.Fatal("b never saw a's stream")
	}
	const flow = 1000
	got := make(chan int, 16)
	far.Register(flow, func(p []byte) { got <- len(p) })

	sizes := map[int]bool{}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		max := c.MaxDatagram()
		if max <= 0 {
			t.Fatalf("MaxDatagram %d on a live connection", max)
		}
		sizes[max] = true
		payload := make([]byte, max-quicvarint.Len(flow))
		if err := c.SendFlowDatagram(flow, payload); err != nil {
			t.Fatalf("a %d-byte datagram, the connection's limit, refused: %v", max, err)
		}
		select {
		case n := <-got:
			if n != len(payload) {
				t.Fatalf("sent %d bytes, got %d", len(payload), n)
			}
		case <-time.After(time.Second):
			t.Fatalf("a datagram of the limit's %d bytes never arrived (sizes so far %v)", max, sizes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.SendFlowDatagram(flow, make([]byte, c.MaxDatagram())); err == nil {
		t.Error("a datagram over the limit was taken")
	}
	t.Logf("limits seen as path MTU discovery ran: %v", sizes)
}
