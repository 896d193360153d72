package quic

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"io"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/pki"
)

// A relay that drains tells the peer connected to it, and answers the
// peer's probes with the same news rather than an echo, so that a peer
// counts the link down. A new connection (the relay restarted) is not
// draining.
func TestDrainReachesPeers(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	a, b := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", make(chan *Conn, 8))
	told := make(chan string, 4)
	upperOf(a).draining = func(peer string) { told <- peer }
	echoes := make(chan []byte, 8)
	upperOf(a).echo = func(_ string, p []byte) { echoes <- p }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendProbe([]byte("12345678")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-echoes:
	case <-ctx.Done():
		t.Fatal("no echo before the drain")
	}
	if a.PeerDraining("b") || c.Draining() {
		t.Fatal("draining before b drains")
	}

	b.Drain()
	select {
	case p := <-told:
		if p != "b" {
			t.Fatalf("told %q drains", p)
		}
	case <-ctx.Done():
		t.Fatal("a never learned that b drains")
	}
	if !a.PeerDraining("b") || !c.Draining() {
		t.Fatal("a does not count b as draining")
	}
	c.SendProbe([]byte("87654321"))
	select {
	case <-echoes:
		t.Fatal("a draining relay echoed a probe")
	case <-time.After(300 * time.Millisecond):
	}

	// The connection b drained on ends: b no longer counts as draining.
	c.CloseWithError(0, "")
	if a.PeerDraining("b") {
		t.Error("b still counts as draining once the connection it said so on is gone")
	}
}

// A peer the manifests no longer name loses its connections at the next
// full recheck; an expiry-only recheck leaves them.
func TestRecheckClosesForgottenPeers(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	b := testEndpoint(t, ca, "b", make(chan *Conn, 8))
	id, _ := ca.Identity("a")
	a, err := Listen(Options{Name: "a", Identity: id, Listen: "127.0.0.1:0", Peers: testPeers,
		Metrics: b.opts.Metrics, Log: b.opts.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Recheck(true); n != 0 || c.Context().Err() != nil {
		t.Fatalf("a known peer with a valid certificate lost its connection (%d closed)", n)
	}
	a.SetPeers(nil)
	if n := a.Recheck(false); n != 0 {
		t.Fatalf("an expiry-only recheck closed %d connections of a peer whose certificate holds", n)
	}
	if n := a.Recheck(true); n != 1 {
		t.Fatalf("a full recheck closed %d connections of a forgotten peer, want 1", n)
	}
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("the connection to a forgotten peer stayed up")
	}
}

// A connection does not outlive its peer's certificate: an expiry recheck
// (a relay runs one every second) closes it once the certificate expired.
func TestRecheckClosesOnExpiry(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	// Issued a minute back: valid for two more seconds.
	certPEM, _, notAfter, err := ca.IssueFor(key.Public(), "", "b", time.Minute+2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	short, err := pki.NewIdentity("b", ca.PEM, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	a := testEndpoint(t, ca, "a", nil)
	b, err := Listen(Options{Name: "b", Identity: short, Listen: "127.0.0.1:0", Peers: testPeers,
		Upper: &testUpper{serve: func(_ *Conn, s *quicgo.Stream) { s.CancelRead(0) }}, Metrics: a.opts.Metrics, Log: a.opts.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Recheck(false); n != 0 {
		t.Fatalf("closed %d connections before the peer's certificate expired", n)
	}
	time.Sleep(time.Until(notAfter) + 100*time.Millisecond)
	if n := a.Recheck(false); n != 1 {
		t.Fatalf("closed %d connections after the peer's certificate expired, want 1", n)
	}
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("the connection outlived its peer's certificate")
	}
}

// A relay whose last flow ended waits, before it closes, until its peer
// read all it sent: closing at once would discard what the peer received
// but had not read (the tail of a transfer to a slow reader). The peer
// closes the connection once its own flows on it ended.
func TestSettleWaitsForThePeerToRead(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	sent := make(chan struct{})
	a := testEndpointWith(t, ca, "a", func(c *Conn, s *quicgo.Stream) {
		io.Copy(io.Discard, s)
		s.Write(make([]byte, size))
		s.Close()
		close(sent)
	})
	b := testEndpoint(t, ca, "b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := b.Links().Link("a", Control, []string{a.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.OpenFlow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release := c.Hold()
	s.Write([]byte("request"))
	s.Close()
	read := make(chan int64, 1)
	go func() {
		defer release()
		// A slow reader: the tail waits in b's buffers when a is done.
		var n int64
		buf := make([]byte, 64<<10)
		for {
			k, err := s.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		read <- n
	}()
	<-sent
	a.Drain()
	start := time.Now()
	if open := a.Settle(ctx); open != 0 {
		t.Errorf("a's peer kept %d connections up", open)
	}
	a.Close()
	if n := <-read; n != size {
		t.Fatalf("b read %d of %d bytes", n, size)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the peer closed %v after it read everything, want at once", d)
	}
}

// A peer of replicas (a sidecar RelayNode) is not down while one replica
// is up: a probe round that went unanswered reached one replica only, and
// a replica that died leaves the others to carry new flows.
func TestReplicasAreDownOnlyTogether(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	a := testEndpoint(t, ca, "a", nil)
	b1, b2 := testEndpoint(t, ca, "b", nil), testEndpoint(t, ca, "b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, b := range []*Endpoint{b1, b2} {
		if _, err := a.Links().Replica("b", Control, b.Addr().String(), []string{b.Addr().String()}).Conn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	a.Links().Answering("b", false)
	if a.Links().PeerDown("b") {
		t.Fatal("one silent probe round makes a peer of two live replicas down")
	}
	b1.Close()
	deadline := time.Now().Add(10 * time.Second)
	for a.Links().ReplicaUp("b", b1.Addr().String()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if a.Links().PeerDown("b") {
		t.Fatal("a peer with a live replica left counts as down after another died")
	}
	if c := a.Links().Live("b"); c == nil {
		t.Fatal("no live replica of b")
	}
}
