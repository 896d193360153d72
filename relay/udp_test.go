package relay_test

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

func udpEcho(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return pc.LocalAddr().String()
}

func udpClient(t *testing.T, port int) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends p and waits for its echo, resending a few times: UDP may
// drop, the test only demands that the payload comes back intact.
func roundTrip(c *net.UDPConn, p []byte) error {
	buf := make([]byte, 65535)
	for range 5 {
		c.Write(p)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			continue
		}
		if !bytes.Equal(buf[:n], p) {
			return fmt.Errorf("echo of %d bytes came back as %d different bytes", len(p), n)
		}
		return nil
	}
	return fmt.Errorf("no echo of %d bytes", len(p))
}

// TestUDP sends packets of every size class, from tiny to larger than any
// QUIC datagram (they ride the session stream), through each route.
func TestUDP(t *testing.T) {
	for name, rt := range routes {
		t.Run(name, func(t *testing.T) {
			target := udpEcho(t)
			port := testutil.FreePort(t)
			_, m, _ := networkOver(t, rt.transport, rt.relays, rt.route, testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: target, Port: port})
			checkUDP(t, udpClient(t, port))
			if v := promtest.ToFloat64(m.UDPSessions.WithLabelValues("r0", "default/u", "entry")); v != 1 {
				t.Fatalf("entry sessions = %v, want 1", v)
			}
		})
	}
}

// TestUDPBulkOverTLS: under auto the sessions of a bulk UDP Tunnel (here
// udp.mode stream) ride TLS on a clean link, framed on the connection, and
// carry every size and a burst as over QUIC, through a middle relay too.
func TestUDPBulkOverTLS(t *testing.T) {
	for _, name := range []string{"1hop-auto", "3hop-auto"} {
		rt := routes[name]
		t.Run(name, func(t *testing.T) {
			target := udpEcho(t)
			port := testutil.FreePort(t)
			_, m, _ := networkOver(t, rt.transport, rt.relays, rt.route,
				testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: target, Port: port, Extra: ", udp: {mode: stream}"})
			checkUDP(t, udpClient(t, port))
			if v := promtest.ToFloat64(m.LinkFlows.WithLabelValues("r0", "r1", "tls", "unmeasured")); v != 1 {
				t.Errorf("sessions r0 opened to r1 over TLS = %v, want 1", v)
			}
			last := rt.route[len(rt.route)-1]
			if v := promtest.ToFloat64(m.UDPSessions.WithLabelValues(last, "default/u", "exit")); v != 1 {
				t.Errorf("exit sessions = %v, want 1", v)
			}
		})
	}
}

// checkUDP sends packets of every size class through c and a burst, and
// checks their echoes.
func checkUDP(t *testing.T, c *net.UDPConn) {
	t.Helper()
	for i, size := range []int{1, 100, 1000, 1200, 1400, 4000, 16000, 65000} {
		p := make([]byte, size)
		testutil.RandReader(uint64(i), int64(size)).Read(p)
		if err := roundTrip(c, p); err != nil {
			t.Fatal(err)
		}
	}
	// 500 packets at about 10,000 a second (unpaced, a loopback
	// sender overflows the test's own receive buffer): nearly all
	// must return.
	got := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(buf); err != nil {
				return
			}
			got++
		}
	}()
	for i := range 500 {
		c.Write(fmt.Appendf(nil, "packet %d", i))
		if i%10 == 9 {
			time.Sleep(time.Millisecond)
		}
	}
	<-done
	if got < 450 {
		t.Fatalf("burst: %d of 500 packets echoed", got)
	}
}

// TestUDPSessionLimitAndIdle fills a two-session table, checks the third
// client is refused and counted, then that idle sessions are reaped at
// every hop and the table has room again.
func TestUDPSessionLimitAndIdle(t *testing.T) {
	target := udpEcho(t)
	port := testutil.FreePort(t)
	_, m, _ := network(t, 3, []string{"r0", "r1", "r2"},
		testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: target, Port: port, Extra: ", udp: {idleTimeoutSeconds: 1, maxSessions: 2}"})
	a, b, c := udpClient(t, port), udpClient(t, port), udpClient(t, port)
	for _, cl := range []*net.UDPConn{a, b} {
		if err := roundTrip(cl, []byte("hi")); err != nil {
			t.Fatal(err)
		}
	}
	c.Write([]byte("third"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 10)); err == nil {
		t.Fatal("third session was served past maxSessions")
	}
	// All three clients share a host, whose share of two sessions is two.
	if v := promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "session_limit")) +
		promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "source_limit")); v < 1 {
		t.Fatalf("session_limit and source_limit drops = %v", v)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if promtest.ToFloat64(m.UDPSessions.WithLabelValues("r0", "default/u", "entry")) == 0 &&
			promtest.ToFloat64(m.UDPSessions.WithLabelValues("r1", "default/u", "middle")) == 0 &&
			promtest.ToFloat64(m.UDPSessions.WithLabelValues("r2", "default/u", "exit")) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, role := range [][2]string{{"r0", "entry"}, {"r1", "middle"}, {"r2", "exit"}} {
		if v := promtest.ToFloat64(m.UDPSessions.WithLabelValues(role[0], "default/u", role[1])); v != 0 {
			t.Errorf("%s sessions after idle timeout = %v, want 0", role[1], v)
		}
	}
	if err := roundTrip(c, []byte("room now")); err != nil {
		t.Fatal(err)
	}
}
