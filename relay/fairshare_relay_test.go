package relay_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestTunnelsShareALinkFairly: Tunnel greedy uploads over 8 flows beside
// Tunnel polite's 1, through two relays over TLS, where every flow is a
// TCP connection of its own, on a 100 Mbit/s link that shares its rate
// per connection (a proxy in front of the exit). Without fair share by
// Tunnel polite got what one connection of 9 gets (11%); with it, about
// half (judged loosely, 25%, for a busy host). Once polite goes, greedy
// has the whole link again.
func TestTunnelsShareALinkFairly(t *testing.T) {
	var greedyGot, politeGot atomic.Int64
	sink := func(n *atomic.Int64) string {
		return testutil.TCPServer(t, func(c *net.TCPConn) {
			buf := make([]byte, 64<<10)
			for {
				m, err := c.Read(buf)
				n.Add(int64(m))
				if err != nil {
					return
				}
			}
		})
	}
	greedy, polite := sink(&greedyGot), sink(&politeGot)
	// 100 Mbit/s: a fraction of what two relays carry here under -race,
	// so the link, not the host, binds. Listening before the free ports
	// are taken, so that none is its.
	link := newSharedLink(t, 100e6)
	exitPort, pG, pP := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	exitAddr := fmt.Sprintf("127.0.0.1:%d", exitPort)
	link.target.Store(&exitAddr)
	udp, err := linkemu.NewUDPProxy(link.Addr().String(), exitAddr, linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"}, Transport: "tls",
		Tunnels: []testutil.TunnelSpec{
			{Name: "greedy", Protocol: "tcp", Target: greedy, Port: pG},
			{Name: "polite", Protocol: "tcp", Target: polite, Port: pP}},
		Ports: map[string]int{"r1": exitPort}, Endpoints: map[string]string{"r1": link.Addr().String()}})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	send := func(port int) *net.TCPConn {
		c := testutil.DialTunnel(t, port)
		go func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for ctx.Err() == nil {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		return c
	}
	for range 8 {
		send(pG)
	}
	lone := send(pP)
	// measure says what each Tunnel carried, in Mbit/s, over seconds
	// after warmup.
	measure := func(warmup time.Duration, seconds int) (g, p float64) {
		time.Sleep(warmup)
		greedyGot.Store(0)
		politeGot.Store(0)
		for i := range seconds {
			time.Sleep(time.Second)
			gs, ps := float64(greedyGot.Swap(0))*8/1e6, float64(politeGot.Swap(0))*8/1e6
			t.Logf("second %d: greedy %.1f Mbit/s, polite %.1f Mbit/s", i, gs, ps)
			g, p = g+gs/float64(seconds), p+ps/float64(seconds)
		}
		return g, p
	}
	// The allocator sets no caps in a link's first second, and polite's
	// connection takes a moment to grow into what the caps free.
	g, p := measure(3*time.Second, 4)
	share := p / (g + p)
	waited := promtest.ToFloat64(m.FairWaited.WithLabelValues("r0", "default/greedy", "r1"))
	t.Logf("polite's share %.1f%%; greedy's flows waited %.1f s for its share", 100*share, waited)
	if share < 0.25 {
		t.Errorf("polite's 1 flow got %.1f%% of what both Tunnels carried beside greedy's 8, want 25%% or more", 100*share)
	}
	if waited == 0 {
		t.Error("greedy's flows never waited for its share")
	}
	// Polite goes: greedy's cap lifts, and it has the whole link again.
	lone.SetLinger(0)
	lone.Close()
	if g, _ = measure(3*time.Second, 2); g < 80 {
		t.Errorf("greedy alone on the link carried %.1f Mbit/s of 100 once polite went, want 80 or more: its cap did not lift", g)
	}
}

// sharedLink forwards TCP connections to target through one rate (bits
// a second) that they share as the kernel shares a link: each
// connection's copy waits its turn for each chunk, so each gets about as
// much as any other.
type sharedLink struct {
	net.Listener
	target atomic.Pointer[string] // where it forwards to, set before the first connection
}

func newSharedLink(t *testing.T, bps float64) *sharedLink {
	t.Helper()
	// A small receive window, set before the handshake: the relay's
	// sockets toward the link do not grow their windows, nor their
	// buffers, without bound as they would with nothing lost on
	// loopback; then what the relay writes is soon what the link
	// carries, as over a link that loses packets when its queue is full.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		return nil
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	const chunk = 16 << 10
	b := rate.NewLimiter(rate.Limit(bps/8), chunk)
	copyShared := func(dst, src *net.TCPConn) {
		buf := make([]byte, chunk)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				b.WaitN(context.Background(), n)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				if err == io.EOF {
					dst.CloseWrite()
					return
				}
				break
			}
		}
		src.Close()
		dst.Close()
	}
	l := &sharedLink{Listener: ln}
	go testutil.Serve(ln, func(c *net.TCPConn) {
		tc, err := net.Dial("tcp", *l.target.Load())
		if err != nil {
			c.Close()
			return
		}
		go copyShared(tc.(*net.TCPConn), c)
		copyShared(c, tc.(*net.TCPConn))
	})
	return l
}
