package relay_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

var routes = map[string]struct {
	relays    int
	route     []string
	transport string
}{
	"plain":    {1, []string{"r0"}, "quic"},
	"1hop":     {2, []string{"r0", "r1"}, "quic"},
	"3hop":     {4, []string{"r0", "r1", "r2", "r3"}, "quic"},
	"1hop-tls": {2, []string{"r0", "r1"}, "tls"},
	"3hop-tls": {4, []string{"r0", "r1", "r2", "r3"}, "tls"},
	// auto: the first flows of a Tunnel take TLS spares, then QUIC when
	// none is ready; its transports change under the flows.
	"1hop-auto": {2, []string{"r0", "r1"}, "auto"},
	"3hop-auto": {4, []string{"r0", "r1", "r2", "r3"}, "auto"},
}

var transports = []string{"quic", "tls", "auto"}

// TestTCPIntegrityAndHalfClose sends 32 MiB up, closes the client's write
// side, and only then has the target answer with 32 MiB: both directions
// must arrive byte for byte, and the answer must get through a half-closed
// flow.
func TestTCPIntegrityAndHalfClose(t *testing.T) {
	const size = 32 << 20
	for name, rt := range routes {
		t.Run(name, func(t *testing.T) {
			type result struct {
				sum [32]byte
				n   int64
			}
			got := make(chan result, 1)
			target := testutil.TCPServer(t, func(c *net.TCPConn) {
				sum, n, _ := testutil.Digest(c) // until the client's EOF
				got <- result{sum, n}
				io.Copy(c, testutil.RandReader(2, size))
				c.CloseWrite()
			})
			port := testutil.FreePort(t)
			_, m, _ := networkOver(t, rt.transport, rt.relays, rt.route, testutil.TunnelSpec{Name: "bulk", Protocol: "tcp", Target: target, Port: port})
			c := testutil.DialTunnel(t, port)
			defer c.Close()
			wantUp, _, _ := testutil.Digest(testutil.RandReader(1, size))
			wantDown, _, _ := testutil.Digest(testutil.RandReader(2, size))
			if _, err := io.Copy(c, testutil.RandReader(1, size)); err != nil {
				t.Fatal(err)
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			down, n, err := testutil.Digest(c)
			if err != nil || n != size || down != wantDown {
				t.Fatalf("down: %d bytes, err %v, digest match %v", n, err, down == wantDown)
			}
			up := <-got
			if up.n != size || up.sum != wantUp {
				t.Fatalf("up: target got %d bytes, digest match %v", up.n, up.sum == wantUp)
			}
			if v := promtest.ToFloat64(m.Bytes.WithLabelValues("r0", "default/bulk", "up")); v != size {
				t.Errorf("entry up bytes metric = %v, want %d", v, size)
			}
		})
	}
}

// TestTCPManyFlows runs 200 concurrent echo flows through three hops.
func TestTCPManyFlows(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { testTCPManyFlows(t, tr) })
	}
}

func testTCPManyFlows(t *testing.T, transport string) {
	target := testutil.TCPServer(t, testutil.Echo)
	port := testutil.FreePort(t)
	networkOver(t, transport, 4, routes["3hop"].route, testutil.TunnelSpec{Name: "echo", Protocol: "tcp", Target: target, Port: port})
	const flows, size = 200, 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, flows)
	for i := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			want := make([]byte, size)
			testutil.RandReader(uint64(i), size).Read(want)
			go func() {
				c.Write(want)
				c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, want) {
				errs <- fmt.Errorf("flow %d: %d bytes back, err %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestTCPResets checks that a reset by the target, and a target that
// refuses the connection, reach the client as a reset, not a clean EOF.
func TestTCPResets(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { testTCPResets(t, tr) })
	}
}

func testTCPResets(t *testing.T, transport string) {
	resetter := testutil.TCPServer(t, func(c *net.TCPConn) {
		buf := make([]byte, 5)
		io.ReadFull(c, buf)
		c.SetLinger(0)
	})
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := closed.Addr().String()
	closed.Close()
	p1, p2 := testutil.FreePort(t), testutil.FreePort(t)
	_, m, _ := networkOver(t, transport, 3, []string{"r0", "r1", "r2"},
		testutil.TunnelSpec{Name: "rst", Protocol: "tcp", Target: resetter, Port: p1},
		testutil.TunnelSpec{Name: "refused", Protocol: "tcp", Target: refused, Port: p2})
	for _, tc := range []struct {
		name string
		port int
	}{{"target resets", p1}, {"target refuses", p2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := testutil.DialTunnel(t, tc.port)
			defer c.Close()
			c.Write([]byte("hello"))
			_, err := io.ReadAll(c)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read ended with %v, want connection reset", err)
			}
		})
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r2", "default/refused", "dial_target")); v != 1 {
		t.Errorf("dial_target errors at exit = %v, want 1", v)
	}
}

// TestTCPClientResetReachesTarget checks the other direction: a client's
// reset tears the flow down at the target.
func TestTCPClientResetReachesTarget(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { testTCPClientReset(t, tr) })
	}
}

func testTCPClientReset(t *testing.T, transport string) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	target := testutil.TCPServer(t, func(c *net.TCPConn) {
		buf := make([]byte, 10)
		if _, err := io.ReadFull(c, buf); err != nil {
			ended <- err
			return
		}
		close(started) // the flow reached the target end to end
		_, err := io.Copy(io.Discard, c)
		ended <- err
	})
	port := testutil.FreePort(t)
	networkOver(t, transport, 3, []string{"r0", "r1", "r2"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	c := testutil.DialTunnel(t, port)
	c.Write([]byte("some bytes"))
	select {
	case <-started:
	case err := <-ended:
		t.Fatalf("target failed before the reset: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("flow never reached the target")
	}
	c.SetLinger(0)
	c.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("target read ended with %v, want connection reset", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("target never saw the client's reset")
	}
}

// TestAutoLearnsAShape: under transport auto the relays learn a Tunnel's
// shape from its flows. Request/response flows (many turns of direction),
// here 600 KB each so not short, ride QUIC once four have ended, at every
// hop; before that they took the link's bulk choice (TLS from a warm
// pool, else QUIC). Once its flows live long in requests and answers (600
// turns each, the moving average past 32 after one such flow), the Tunnel
// rides TLS on these short clean links. The choices show in
// hoplink_link_flows_total.
func TestAutoLearnsAShape(t *testing.T) {
	// The target answers a request once all of it is in: an echo answers
	// as it reads, so a 20 KB request read in pieces turned the flow's
	// direction many times at a slow relay (under the race detector),
	// which then took it for long-lived.
	target := testutil.TCPServer(t, func(c *net.TCPConn) {
		defer c.Close()
		var size [4]byte
		for {
			if _, err := io.ReadFull(c, size[:]); err != nil {
				return
			}
			req := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			if _, err := c.Write(req); err != nil {
				return
			}
		}
	})
	port := testutil.FreePort(t)
	_, m, _ := networkOver(t, "auto", 3, []string{"r0", "r1", "r2"}, testutil.TunnelSpec{Name: "rr", Protocol: "tcp", Target: target, Port: port})
	flows := func(from, to, transport, reason string) float64 {
		return promtest.ToFloat64(m.LinkFlows.WithLabelValues(from, to, transport, reason))
	}
	// exchange sends n requests of size bytes through a flow, each
	// answered before the next.
	exchange := func(n, size int) {
		c := testutil.DialTunnel(t, port)
		defer c.Close()
		msg, buf := binary.BigEndian.AppendUint32(nil, uint32(size)), make([]byte, size)
		msg = append(msg, bytes.Repeat([]byte{'q'}, size)...)
		for range n {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	links := [][2]string{{"r0", "r1"}, {"r1", "r2"}}
	// until exchanges flows until every link took one as reason says.
	until := func(n, size int, transport, reason string) {
		t.Helper()
		// Each relay counts a flow's end when its own side of the flow
		// ends, which may come after the next flow started: a few more
		// flows.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			exchange(n, size)
			if flows("r0", "r1", transport, reason) > 0 && flows("r1", "r2", transport, reason) > 0 {
				return
			}
		}
		for _, l := range links {
			if flows(l[0], l[1], transport, reason) == 0 {
				t.Errorf("%s -> %s: no flow rode %s as %s; flows: %v", l[0], l[1], transport, reason, promtest.CollectAndCount(m.LinkFlows))
			}
		}
	}
	// 15 requests of 20 KB: interactive, not long-lived.
	for range 4 {
		exchange(15, 20<<10)
	}
	for _, l := range links {
		if n := flows(l[0], l[1], "quic", "interactive"); n != 0 {
			t.Fatalf("%s -> %s: %v interactive flows before the shape was known", l[0], l[1], n)
		}
	}
	until(15, 20<<10, "quic", "interactive")
	// 300 requests of 1,000 bytes: long-lived interactive.
	until(300, 1000, "tls", "long_interactive")
}
