package relay_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestOneTunnelCannotTakeEveryFlow: a client holds as many idle
// connections to one Tunnel as it can open. The relay gives that Tunnel its
// share of the flow tokens and no more, so another Tunnel's clients are
// served (with --max-flows 1000 they were reset).
func TestOneTunnelCannotTakeEveryFlow(t *testing.T) {
	target := testutil.EchoServer(t)
	pA, pB := testutil.FreePort(t), testutil.FreePort(t)
	// 40 flows a relay, 10 a Tunnel, 5 a Tunnel from one host.
	_, m, _ := networkWith(t, relay.Config{MaxFlows: 40, MaxFlowsPerSource: 5}, "quic", 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "a", Protocol: "tcp", Target: target, Port: pA},
		testutil.TunnelSpec{Name: "b", Protocol: "tcp", Target: target, Port: pB})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 60 {
		// From five hosts of the loopback network, to reach the Tunnel's
		// share rather than one host's.
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i%5))}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", pA))
		if err == nil {
			held = append(held, c)
		}
	}
	time.Sleep(300 * time.Millisecond)
	for i := range 5 {
		c := testutil.DialTunnel(t, pB)
		msg := fmt.Sprintf("another tenant %d", i)
		c.Write([]byte(msg))
		c.CloseWrite()
		if b, err := io.ReadAll(c); err != nil || string(b) != msg {
			t.Fatalf("Tunnel b next to a full Tunnel a: %q, %v", b, err)
		}
		c.Close()
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/a", "tunnel_limit")); v < 1 {
		t.Fatalf("Tunnel a was never held to its share (tunnel_limit %v)", v)
	}
	// One host alone gets its share of a Tunnel, not the Tunnel's.
	before := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/b", "source_limit"))
	var mine []net.Conn
	for range 8 {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", pB), 2*time.Second); err == nil {
			mine = append(mine, c)
		}
	}
	// The relay counts each refusal as it accepts the flow, which on a
	// busy host may come after the dial returned.
	sourceLimit := func() float64 {
		return promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/b", "source_limit"))
	}
	for deadline := time.Now().Add(5 * time.Second); sourceLimit() < before+3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range mine {
		c.Close()
	}
	if v := sourceLimit(); v < before+3 {
		t.Fatalf("8 flows from one host: source_limit %v -> %v, want 3 more", before, v)
	}
}

// TestUDPFloodDoesNotLockOutATunnel: a host floods a UDP Tunnel from
// hundreds of source ports. It gets a host's share of the sessions, and a
// client on another host still gets one; a host's share, or a table, full
// of sessions gone quiet makes room for a new client.
func TestUDPFloodDoesNotLockOutATunnel(t *testing.T) {
	target := udpEcho(t)
	port := testutil.FreePort(t)
	_, m, _ := networkOver(t, "quic", 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: target, Port: port, Extra: ", udp: {maxSessions: 64}"})
	flood := func(host byte, ports int) {
		for i := range ports {
			if i%50 == 49 {
				time.Sleep(5 * time.Millisecond) // within the socket's buffer
			}
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 2, host)}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("x"))
			c.Close()
		}
	}
	flood(1, 300)
	// The kernel may drop some of the flood before the relay reads it; most
	// of it reaches the relay, and all but a host's share is refused.
	waitUntil(t, 10*time.Second, "the flood read", func() bool {
		return promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "source_limit")) >= 200
	})
	if v := promtest.ToFloat64(m.UDPSessions.WithLabelValues("r0", "default/u", "entry")); v > 16 {
		t.Fatalf("one host of 300 ports got %v sessions, more than its share", v)
	}
	client := func(host byte) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 3, host)}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		return roundTrip(c, []byte("hello"))
	}
	if err := client(1); err != nil {
		t.Fatalf("a client on another host, next to the flood: %v", err)
	}
	// The flooding host's sessions went quiet: its next client takes the
	// place of the idlest of them, a second later, not the idle timeout's
	// minute (issue 40).
	time.Sleep(1200 * time.Millisecond)
	same, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 2, 1)}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if err := roundTrip(same, []byte("hello")); err != nil {
		t.Fatalf("a new client of the flooding host once its sessions went quiet: %v", err)
	}
	// Fill the table from more hosts; once its sessions go quiet, a new
	// client takes the place of the idlest.
	for h := byte(2); h <= 5; h++ {
		flood(h, 16)
	}
	time.Sleep(1200 * time.Millisecond)
	if err := client(9); err != nil {
		t.Fatalf("a new client with the table full of quiet sessions: %v", err)
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/u", "evicted")); v < 1 {
		t.Fatalf("no session evicted (evicted %v)", v)
	}
}

// TestIdleTCPFlowsEnd: a client that opens a connection and goes quiet
// holds the relays' flows only for its Tunnel's idle timeout (here 1 s;
// an hour by default); one that keeps talking stays.
func TestIdleTCPFlowsEnd(t *testing.T) {
	target := testutil.EchoServer(t)
	port := testutil.FreePort(t)
	_, m, _ := network(t, 3, []string{"r0", "r1", "r2"},
		testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port, Extra: ", tcp: {idleTimeoutSeconds: 1}"})
	quiet, talking := testutil.DialTunnel(t, port), testutil.DialTunnel(t, port)
	defer quiet.Close()
	defer talking.Close()
	quiet.Write([]byte("hi"))
	io.ReadFull(quiet, make([]byte, 2))
	start := time.Now()
	for time.Since(start) < 2500*time.Millisecond {
		talking.Write([]byte("x"))
		if _, err := io.ReadFull(talking, make([]byte, 1)); err != nil {
			t.Fatalf("a talking flow ended after %v: %v", time.Since(start), err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	quiet.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := quiet.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a quiet flow after %v: %v, want a reset", time.Since(start), err)
	}
	// Every hop keeps the timeout; whichever fires first resets the rest.
	idle := 0.0
	for _, r := range []string{"r0", "r1", "r2"} {
		idle += promtest.ToFloat64(m.FlowErrors.WithLabelValues(r, "default/t", "idle"))
	}
	if idle < 1 {
		t.Fatal("no idle flow counted")
	}
}

// A Tunnel whose port another process holds keeps no other Tunnel of its
// entry relay from serving: the relay starts, reports the entry it could
// not open (hoplink_tunnel_open 0, TunnelErrors) and opens it once the
// port is free.
func TestTunnelWhosePortIsTakenDoesNotStopTheRelay(t *testing.T) {
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	taken := holder.Addr().(*net.TCPAddr).Port
	echo := testutil.EchoServer(t)
	okPort := testutil.FreePort(t)
	n, m, _ := network(t, 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "blocked", Protocol: "tcp", Target: echo, Port: taken},
		testutil.TunnelSpec{Name: "ok", Protocol: "tcp", Target: echo, Port: okPort})
	if !n.Ready() {
		t.Fatal("the relays are not ready")
	}
	exchange := func(port int) error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		b := make([]byte, 4)
		_, err = io.ReadFull(c, b)
		return err
	}
	if err := exchange(okPort); err != nil {
		t.Fatalf("the other Tunnel of the relay: %v", err)
	}
	errs := n.Relays[0].TunnelErrors()
	if !strings.Contains(errs["default/blocked"], "address already in use") {
		t.Errorf("TunnelErrors %v, want default/blocked's bind error", errs)
	}
	if v := promtest.ToFloat64(m.TunnelOpen.WithLabelValues("r0", "default/blocked")); v != 0 {
		t.Errorf("hoplink_tunnel_open %v for the Tunnel that cannot open", v)
	}
	holder.Close()
	deadline := time.Now().Add(3 * tunnelRetryForTest)
	for promtest.ToFloat64(m.TunnelOpen.WithLabelValues("r0", "default/blocked")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the Tunnel did not open once its port was free")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := exchange(taken); err != nil {
		t.Fatalf("the Tunnel opened on retry: %v", err)
	}
	if errs := n.Relays[0].TunnelErrors(); len(errs) != 0 {
		t.Errorf("TunnelErrors after the retry: %v", errs)
	}
}

// tunnelRetryForTest is relay's retry interval.
const tunnelRetryForTest = 5 * time.Second
