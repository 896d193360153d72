package relay_test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestUDPStalledSessionHoldsUpNoOther: one session of a bulk UDP Tunnel
// whose next hop stops reading (its TLS connection stalls) is ended after
// a second, counted, while another session of the same Tunnel goes on, and
// the stalled client's next packets start a session that works. Before
// the entry bounded its writes, the Tunnel's one read loop blocked in the
// stalled session's write for good, and no client of the Tunnel got
// through.
func TestUDPStalledSessionHoldsUpNoOther(t *testing.T) {
	target := udpEcho(t)
	exitPort, port := testutil.FreePort(t), testutil.FreePort(t)
	exitAddr := fmt.Sprintf("127.0.0.1:%d", exitPort)
	// The exit's endpoint is a proxy: TCP through one that can stall a
	// connection, UDP (QUIC: probes, the link itself) straight through.
	stall := newStallProxy(t, exitAddr)
	up, err := linkemu.NewUDPProxy(stall.ln.Addr().String(), exitAddr, linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"}, Transport: "auto",
		Tunnels: []testutil.TunnelSpec{{Name: "u", Protocol: "udp", Target: target, Port: port, Extra: ", udp: {mode: stream}"}},
		Ports:   map[string]int{"r1": exitPort}, Endpoints: map[string]string{"r1": stall.ln.Addr().String()}})

	a, b := udpClient(t, port), udpClient(t, port)
	for _, c := range []*net.UDPConn{a, b} {
		if err := roundTrip(c, []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	if v := promtest.ToFloat64(m.LinkFlows.WithLabelValues("r0", "r1", "tls", "unmeasured")); v != 2 {
		t.Fatalf("sessions over TLS = %v, want 2", v)
	}
	// a's connection becomes the busiest, and then stops being read.
	p := make([]byte, 1200)
	for i := range 1000 {
		a.Write(p)
		if i%50 == 49 {
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	stalled := stall.stallBusiest()
	// a floods: far more than the connection's socket buffers hold.
	for i := range 20000 {
		a.Write(p)
		if i%100 == 99 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if err := roundTrip(b, []byte("still here")); err != nil {
		t.Fatalf("a second session of the Tunnel, beside a stalled one: %v", err)
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/u", "stalled")); v != 1 {
		t.Errorf("stalled sessions counted: %v, want 1", v)
	}
	// Drain a's echoes of the flood; its next packets start a new session
	// (on a connection that is not stalled).
	buf := make([]byte, 2048)
	for {
		a.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := a.Read(buf); err != nil {
			break
		}
	}
	if err := roundTrip(a, []byte("after the stall")); err != nil {
		t.Fatalf("the stalled client, after its session ended: %v", err)
	}
	stalled.Store(false)
}

// stallProxy forwards TCP connections to a target and can stop reading
// one, as a next hop that no longer reads would. Its sockets keep small
// buffers, so that a stalled connection fills up quickly.
type stallProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []*stallConn
}

type stallConn struct {
	up      atomic.Int64 // bytes read from the dialer
	stalled atomic.Bool
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(done); ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.handle(c.(*net.TCPConn), done) })
		}
	})
	return p
}

func (p *stallProxy) handle(c *net.TCPConn, done chan struct{}) {
	defer c.Close()
	c.SetReadBuffer(64 << 10)
	tc, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer tc.Close()
	sc := &stallConn{}
	p.mu.Lock()
	p.conns = append(p.conns, sc)
	p.mu.Unlock()
	go func() {
		<-done
		c.Close()
		tc.Close()
	}()
	go io.Copy(c, tc)
	buf := make([]byte, 32<<10)
	for {
		for sc.stalled.Load() {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		n, err := c.Read(buf)
		sc.up.Add(int64(n))
		if _, werr := tc.Write(buf[:n]); err != nil || werr != nil {
			return
		}
	}
}

// stallBusiest stops reading the connection that carried the most bytes
// so far; storing false resumes it.
func (p *stallProxy) stallBusiest() *atomic.Bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var busiest *stallConn
	for _, c := range p.conns {
		if busiest == nil || c.up.Load() > busiest.up.Load() {
			busiest = c
		}
	}
	busiest.stalled.Store(true)
	return &busiest.stalled
}
