package relay_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// A Tunnel with spec.listen.allowedSources takes clients from those
// networks alone: a TCP connection from elsewhere is reset before anything
// of the chain sees it, a UDP datagram dropped, each counted.
func TestAllowedSources(t *testing.T) {
	tcpPort, udpPort := testutil.FreePort(t), testutil.FreePort(t)
	allow := ", allowedSources: [127.0.0.2/32, '::1/128']"
	_, m, _ := network(t, 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: testutil.EchoServer(t), Port: tcpPort, ListenExtra: allow},
		testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: udpEcho(t), Port: udpPort, ListenExtra: allow})

	dialFrom := func(src string) (net.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort))
	}
	c, err := dialFrom("127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "hello" {
		t.Fatalf("from an allowed source: echo %q, %v", got, err)
	}
	c.Close()

	// The kernel completes the handshake and the relay resets, perhaps
	// before the dial has returned.
	switch c, err = dialFrom("127.0.0.3"); {
	case errors.Is(err, syscall.ECONNRESET):
	case err != nil:
		t.Fatal(err)
	default:
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "hello")
		if got, err := io.ReadAll(c); len(got) > 0 || err == nil {
			t.Fatalf("from a source not allowed: read %q, %v; want a reset", got, err)
		}
		c.Close()
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/t", "source_not_allowed")); v != 1 {
		t.Fatalf("flow_errors{reason=source_not_allowed} = %v, want 1", v)
	}

	udpFrom := func(src string) *net.UDPConn {
		u, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)}, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: udpPort})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.Close() })
		return u
	}
	if err := roundTrip(udpFrom("127.0.0.2"), []byte("ping")); err != nil {
		t.Fatalf("UDP from an allowed source: %v", err)
	}
	if err := roundTrip(udpFrom("127.0.0.3"), []byte("ping")); err == nil {
		t.Fatal("UDP from a source not allowed came back")
	}
	if v := promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "source_not_allowed")); v < 1 {
		t.Fatalf("udp_dropped{reason=source_not_allowed} = %v", v)
	}
}
