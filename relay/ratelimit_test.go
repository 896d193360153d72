package relay_test

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestTunnelRateLimit: a Tunnel with spec.limits.rateMbps carries no
// faster than its rate in either direction, through a chain (the entry
// holds the upload, the exit the download) and through one relay that is
// both. Without the limit the same bytes take a third of the time or less
// (race detector on); only the lower bound is checked, which a busy host
// cannot break.
func TestTunnelRateLimit(t *testing.T) {
	const (
		mbps = 8       // 1 MB/s: a third of what two relays under -race carry here
		size = 2 << 20 // 2 s at the rate, each way
	)
	for _, route := range [][]string{{"r0", "r1"}, {"r0"}} {
		t.Run(fmt.Sprintf("%d relays", len(route)), func(t *testing.T) {
			target := testutil.SinkThenSource(t)
			port := testutil.FreePort(t)
			_, m, _ := network(t, len(route), route,
				testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port, Extra: fmt.Sprintf(", limits: {rateMbps: %d}", mbps)})
			start := time.Now()
			if err := testutil.TCPExchange(func() (net.Conn, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)) }, size); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			perWay := time.Duration(float64(size) / (mbps * 1e6 / 8) * float64(time.Second))
			t.Logf("%d MiB each way at %d Mbit/s: %v (%v a way at the rate)", size>>20, mbps, took, perWay)
			// A bucket lets a 64 KiB burst through at once: well under 5%.
			if took < 2*perWay*95/100 {
				t.Errorf("the exchange took %v, faster than the Tunnel's rate allows both ways (%v)", took, 2*perWay)
			}
			exit := route[len(route)-1]
			up := promtest.ToFloat64(m.RateWaited.WithLabelValues("r0", "default/t", "up"))
			down := promtest.ToFloat64(m.RateWaited.WithLabelValues(exit, "default/t", "down"))
			if up == 0 || down == 0 {
				t.Errorf("waited for the rate %.2fs up at r0, %.2fs down at %s: want each direction held where it leaves the relays", up, down, exit)
			}
		})
	}
}

// TestUDPRateLimit: datagrams over a Tunnel's rate are dropped at its
// entry and counted, and those within it still arrive.
func TestUDPRateLimit(t *testing.T) {
	target := udpEcho(t)
	port := testutil.FreePort(t)
	_, m, _ := network(t, 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: target, Port: port, Extra: ", limits: {rateMbps: 1}"})
	c := udpClient(t, port)
	defer c.Close()
	// 400 KB at once, against 125 KB a second and a 64 KiB burst.
	payload := make([]byte, 1000)
	for i := range 400 {
		if i%50 == 49 {
			time.Sleep(2 * time.Millisecond) // within the socket's buffer
		}
		c.Write(payload)
	}
	got := 0
	buf := make([]byte, 2000)
	c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
		got++
	}
	dropped := promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "rate_limit"))
	t.Logf("%d of 400 datagrams answered, %.0f dropped over the rate", got, dropped)
	if got == 0 {
		t.Fatal("no datagram within the rate came back")
	}
	if dropped < 100 || got > 300 {
		t.Errorf("%d of 400 datagrams answered and %.0f dropped over the rate, want most dropped: 1 Mbit/s lets about 65 KiB through at once and 125 KB a second", got, dropped)
	}
}

// TestTunnelMaxFlows: a Tunnel with spec.limits.maxFlows gets that many
// flows at once; the next is reset at the entry and counted, and the open
// ones carry on.
func TestTunnelMaxFlows(t *testing.T) {
	target := testutil.EchoServer(t)
	port := testutil.FreePort(t)
	_, m, _ := network(t, 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port, Extra: ", limits: {maxFlows: 2}"})
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		return err
	}
	var open []net.Conn
	for i := range 2 {
		c := testutil.DialTunnel(t, port)
		defer c.Close()
		if err := echo(c); err != nil {
			t.Fatalf("flow %d of 2: %v", i, err)
		}
		open = append(open, c)
	}
	if third := testutil.DialRefusable(t, port); third != nil {
		defer third.Close()
		if err := echo(third); err == nil {
			t.Fatal("a third flow of a Tunnel with maxFlows 2 was carried")
		}
	}
	if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/t", "tunnel_limit")); v != 1 {
		t.Errorf("tunnel_limit counted %v times, want 1", v)
	}
	for i, c := range open {
		if err := echo(c); err != nil {
			t.Errorf("open flow %d after the third was refused: %v", i, err)
		}
	}
	open[0].Close()
	testutil.WaitFor(t, "a place freed by a flow that ended", func() error {
		c := testutil.DialTunnel(t, port)
		defer c.Close()
		return echo(c)
	})
}

// TestRateLimitHoldsManyFlows: flows that start at once share their
// Tunnel's rate from their first byte (a flow's first buffer does not go
// out before the bucket has it), and flows waiting for their turn end as
// soon as their clients leave, so the relay closes at once.
func TestRateLimitHoldsManyFlows(t *testing.T) {
	const flows, each = 40, 256 << 10
	var got atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go testutil.Serve(ln, func(c *net.TCPConn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	port := testutil.FreePort(t)
	n, _, _ := network(t, 1, []string{"r0"},
		testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: ln.Addr().String(), Port: port, Extra: ", limits: {rateMbps: 1}"})
	var conns []*net.TCPConn
	start := time.Now()
	for range flows {
		c := testutil.DialTunnel(t, port)
		conns = append(conns, c)
		go c.Write(make([]byte, each))
	}
	time.Sleep(time.Second)
	elapsed, sent := time.Since(start), got.Load()
	// 1 Mbit/s is 125,000 bytes a second, after a burst of 64 KiB.
	allowed := int64(64<<10) + int64(125000*elapsed.Seconds()) + 64<<10
	t.Logf("%d flows: %d bytes reached the target in %v, the rate allows %d", flows, sent, elapsed, allowed)
	if sent > allowed {
		t.Errorf("%d bytes reached the target in %v, more than the rate allows (%d): each flow's first write ran ahead of the bucket", sent, elapsed, allowed)
	}
	// The flows still wait for about 80 s of the rate; their clients go.
	for _, c := range conns {
		c.SetLinger(0)
		c.Close()
	}
	closed := make(chan struct{})
	closing := time.Now()
	go func() { n.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("the relay closed %v after the clients left", time.Since(closing))
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not close within 10 s: flows still wait for the rate after their clients left")
	}
}
