package relay_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/tlslink"
)

func dialRelay(ctx context.Context, id *pki.Identity, peer string, addr net.Addr) (*quicgo.Conn, error) {
	return quicgo.DialAddr(ctx, addr.String(), id.ClientConfig(peer), &quicgo.Config{EnableDatagrams: true})
}

// TestForeignCertificateRejected dials a relay with a certificate from
// another CA, and with a valid certificate for a relay no manifest names.
func TestForeignCertificateRejected(t *testing.T) {
	n, m, _ := network(t, 2, []string{"r0", "r1"})
	exit := n.Relays[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	other, _ := pki.NewCA("someone else")
	foreign, err := other.Identity("r0")
	if err != nil {
		t.Fatal(err)
	}
	trust := x509.NewCertPool() // trust the real CA, so only our certificate is wrong
	trust.AddCert(n.CA.Cert)
	foreign.SetRoots(trust)
	if c, err := dialRelay(ctx, foreign, "r1", exit.Addr()); err == nil {
		// The server may reject after the client's handshake completes.
		if _, err := c.AcceptStream(ctx); err == nil {
			t.Fatal("connection with a foreign certificate stayed usable")
		}
	}
	if v := promtest.ToFloat64(m.Handshakes.WithLabelValues("r1", "accept", "rejected")); v < 1 {
		t.Fatalf("rejected handshakes = %v, want >= 1", v)
	}

	stranger, _ := n.CA.Identity("mallory")
	before := promtest.ToFloat64(m.Handshakes.WithLabelValues("r1", "accept", "rejected"))
	if c, err := dialRelay(ctx, stranger, "r1", exit.Addr()); err == nil {
		if _, err := c.AcceptStream(ctx); err == nil {
			t.Fatal("connection from an unknown relay stayed usable")
		}
	}
	if v := promtest.ToFloat64(m.Handshakes.WithLabelValues("r1", "accept", "rejected")); v != before+1 {
		t.Fatalf("unknown relay: rejected handshakes %v -> %v", before, v)
	}
}

// TestForgedHeaders connects to the exit with a valid certificate and asks
// for things the manifests do not allow. Each stream must be reset and
// counted, nothing may be dialed, and the relay must keep serving.
func TestForgedHeaders(t *testing.T) {
	target := testutil.TCPServer(t, testutil.Echo)
	decoy, _ := net.Listen("tcp", "127.0.0.1:0")
	defer decoy.Close()
	dialed := make(chan struct{}, 10)
	go func() {
		for {
			c, err := decoy.Accept()
			if err != nil {
				return
			}
			dialed <- struct{}{}
			c.Close()
		}
	}()
	port := testutil.FreePort(t)
	n, m, _ := network(t, 3, []string{"r0", "r1", "r2"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	exit := n.Relays[2]
	mid, _ := n.CA.Identity("r1") // a legitimate peer of the exit, turned hostile
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := dialRelay(ctx, mid, "r2", exit.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")

	for _, tc := range []struct {
		name, reason string
		header       []byte
	}{
		{"other target", "bad_target", encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r2"}, Target: decoy.Addr().String()})},
		{"unknown tunnel", "unknown_tunnel", encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/nope", Route: []string{"r2"}, Target: target})},
		{"wrong protocol", "wrong_protocol", encode(t, hop.Header{Kind: hop.KindUDP, Tunnel: "default/t", Route: []string{"r2"}, Target: target})},
		{"route skipping the exit", "bad_route", encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r2", "r0"}, Target: target})},
		{"garbage", "bad_header", []byte("GET / HTTP/1.1\r\n\r\n")},
		{"truncated", "bad_header", encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r2"}, Target: target})[:7]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.Write(tc.header)
			if tc.name == "truncated" {
				s.Close()
			}
			s.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, err = io.ReadAll(s)
			var se *quicgo.StreamError
			if !errors.As(err, &se) || hop.Code(se.ErrorCode) != hop.CodeRejected {
				t.Fatalf("stream ended with %v, want a reset with code %d", err, hop.CodeRejected)
			}
			if v := promtest.ToFloat64(m.Rejected.WithLabelValues("r2", tc.reason)); v < 1 {
				t.Fatalf("rejected{reason=%s} = %v", tc.reason, v)
			}
		})
	}
	// A peer that is not the previous hop of the route (r0 skipping r1).
	entryID, _ := n.CA.Identity("r0")
	c0, err := dialRelay(ctx, entryID, "r2", exit.Addr())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c0.OpenStreamSync(ctx)
	s.Write(encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r2"}, Target: target}))
	if _, err := io.ReadAll(s); err == nil {
		t.Fatal("exit accepted a flow from a relay that is not its previous hop")
	}
	c0.CloseWithError(0, "")

	// The same forgery over the TLS transport.
	before := promtest.ToFloat64(m.Rejected.WithLabelValues("r2", "bad_target"))
	tc, err := tls.Dial("tcp", exit.Addr().String(), mid.ClientConfig("r2"))
	if err != nil {
		t.Fatal(err)
	}
	tc.Write(encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r2"}, Target: decoy.Addr().String()}))
	tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(tc); err == nil {
		t.Fatal("TLS flow with a forged target ended cleanly, want a reset")
	}
	tc.Close()
	if v := promtest.ToFloat64(m.Rejected.WithLabelValues("r2", "bad_target")); v != before+1 {
		t.Fatalf("TLS forged target: rejected{bad_target} %v -> %v", before, v)
	}
	select {
	case <-dialed:
		t.Fatal("a forged header made the exit dial the decoy")
	default:
	}
	// The relay still serves the real chain.
	c := testutil.DialTunnel(t, port)
	defer c.Close()
	c.Write([]byte("still alive"))
	c.CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "still alive" {
		t.Fatalf("after attacks: %q, %v", b, err)
	}
}

func encode(t *testing.T, h hop.Header) []byte {
	b, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPeerRestart stops the middle relay, checks flows fail fast rather
// than hang, starts it again and checks the chain recovers by itself.
func TestPeerRestart(t *testing.T) {
	target := testutil.TCPServer(t, testutil.Echo)
	port := testutil.FreePort(t)
	n, _, set := network(t, 3, []string{"r0", "r1", "r2"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	try := func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(15 * time.Second))
		c.Write([]byte("ping"))
		c.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ping" {
			return fmt.Errorf("got %q, %v", b, err)
		}
		return nil
	}
	if err := try(); err != nil {
		t.Fatal(err)
	}
	n.Relays[1].Close()
	start := time.Now()
	if err := try(); err == nil {
		t.Fatal("flow succeeded with the middle relay down")
	}
	if d := time.Since(start); d > 14*time.Second {
		t.Fatalf("flow with a dead middle relay took %v to fail", d)
	}
	id, _ := n.CA.Identity("r1")
	r1, err := relay.New(relay.Config{Name: "r1", Manifests: set, Identity: id, Metrics: metrics.New(prometheus.NewRegistry()), Log: testutil.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Start(); err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := try()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chain did not recover after the relay restarted: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHalfHeadersAreBounded: an authenticated peer opens thousands of
// streams and sends half a header on each. A relay keeps at most
// nexthop.MaxPendingHeaders of a peer's streams waiting (no flow token is taken
// before the header), resets the rest at once, and goes on serving.
func TestHalfHeadersAreBounded(t *testing.T) {
	target := testutil.EchoServer(t)
	port := testutil.FreePort(t)
	// r2 is a relay of the manifests (so its certificate is good) on no
	// route: the attacker.
	n, m, _ := network(t, 3, []string{"r0", "r1"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	exit := n.Relays[1]
	id, _ := n.CA.Identity("r2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := quicgo.DialAddr(ctx, exit.Addr().String(), id.ClientConfig("r1"), &quicgo.Config{EnableDatagrams: true, MaxIncomingStreams: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	goroutines := runtime.NumGoroutine()
	half := encode(t, hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"r1"}, Target: target})[:6]
	const streams = 2000
	for range streams {
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(half)
	}
	waitUntil(t, 10*time.Second, "streams over the bound refused", func() bool {
		return promtest.ToFloat64(m.Rejected.WithLabelValues("r1", "header_limit")) >= streams-256
	})
	if grown := runtime.NumGoroutine() - goroutines; grown > 1000 {
		t.Errorf("%d goroutines more for %d half headers", grown, streams)
	}
	c := testutil.DialTunnel(t, port)
	defer c.Close()
	c.Write([]byte("still serving"))
	c.CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "still serving" {
		t.Fatalf("a flow next to the half headers: %q, %v", b, err)
	}
}

// TestHandshakesAreBounded: a host opens hundreds of TCP connections to a
// relay's TLS port and never says hello. At most MaxHandshakesPerSource of
// them wait for a handshake, the newest: each past the share closes the
// host's oldest as it is accepted. Peers from other hosts still connect.
func TestHandshakesAreBounded(t *testing.T) {
	target := testutil.EchoServer(t)
	port := testutil.FreePort(t)
	n, _, _ := networkOver(t, "tls", 2, []string{"r0", "r1"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	exit := n.Relays[1]
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 300 {
		c, err := d.Dial("tcp", exit.Addr().String())
		if err != nil {
			continue
		}
		held = append(held, c)
	}
	// Each past the source's share closes its oldest as it is accepted;
	// the accepts may trail the dials a little on a busy host.
	closed := make([]bool, len(held))
	count := 0
	for deadline := time.Now().Add(5 * time.Second); count < len(held)-tlslink.MaxHandshakesPerSource && time.Now().Before(deadline); {
		for i, c := range held {
			if closed[i] {
				continue
			}
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
				closed[i] = true
				count++
			}
		}
	}
	if want := len(held) - tlslink.MaxHandshakesPerSource; count < want {
		t.Fatalf("%d of %d silent connections from one host were closed, want %d", count, len(held), want)
	}
	for i := range held[len(held)-tlslink.MaxHandshakesPerSource:] {
		if closed[len(held)-tlslink.MaxHandshakesPerSource+i] {
			t.Fatalf("connection %d of the newest %d was closed: the oldest give way", i, tlslink.MaxHandshakesPerSource)
		}
	}
	c := testutil.DialTunnel(t, port)
	defer c.Close()
	c.Write([]byte("still serving"))
	c.CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "still serving" {
		t.Fatalf("a TLS flow next to the silent connections: %q, %v", b, err)
	}
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
