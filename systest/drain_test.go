package systest

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// slowExchange is tcpExchange with the client's bytes paced over about
// pace: a transfer that is open when a relay is told to stop.
func slowExchange(addr string, size int64, pace time.Duration) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	chunks := int64(64)
	return testutil.TCPExchange(func() (net.Conn, error) {
		return &pacedConn{TCPConn: c.(*net.TCPConn), chunk: int(size / chunks), gap: pace / time.Duration(chunks)}, nil
	}, size)
}

// pacedConn writes in chunks with a pause between them.
type pacedConn struct {
	*net.TCPConn
	chunk int
	gap   time.Duration
}

func (p *pacedConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), p.chunk)
		w, err := p.TCPConn.Write(b[:k])
		n += w
		if err != nil {
			return n, err
		}
		b = b[k:]
		time.Sleep(p.gap)
	}
	return n, nil
}

// ReadFrom keeps io.Copy on the paced Write.
func (p *pacedConn) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{p}, r)
}

// refusedWithin opens a flow through the Tunnel and says how long it took
// to be refused: a connect refused, or a reset or EOF before any answer.
func refusedWithin(addr string) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return time.Since(start), nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("hello"))
	var b [16]byte
	if _, err := c.Read(b[:]); err == nil {
		return 0, errors.New("the flow was carried, not refused")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return 0, errors.New("the flow hung: neither carried nor refused")
	}
	return time.Since(start), nil
}

// TestDrain stops each relay of a three-relay chain with SIGTERM while a
// transfer crosses it: the transfer completes byte-exact, a new flow is
// refused fast (the entry's listener is closed; an entry whose next hop
// drains refuses at once), and the relay exits once its flows ended, well
// before its drain timeout.
func TestDrain(t *testing.T) {
	bin := procs.Hoplink(t)
	target := testutil.SinkThenSource(t)

	for _, transport := range []string{"quic", "tls"} {
		for _, role := range []string{"hk", "m", "la"} {
			t.Run(transport+"/"+role, func(t *testing.T) {
				n := procs.StartNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: "+transport+"}")
				done := make(chan error, 1)
				go func() { done <- slowExchange(n.Listen, 4<<20, 1500*time.Millisecond) }()
				time.Sleep(300 * time.Millisecond)
				p := n.Procs[role]
				stopped := time.Now()
				p.Process.Signal(syscall.SIGTERM)
				exited := make(chan error, 1)
				go func() { exited <- procs.Wait(p) }()

				// The news reaches the entry within a round trip.
				time.Sleep(100 * time.Millisecond)
				took, err := refusedWithin(n.Listen)
				if err != nil {
					t.Errorf("a new flow while %s drains: %v", role, err)
				} else if took > 100*time.Millisecond {
					t.Errorf("a new flow while %s drains was refused after %v, want within 100ms", role, took)
				}

				if err := <-done; err != nil {
					t.Fatalf("the open transfer across %s's drain: %v\n%s", role, err, n.Log(role))
				}
				select {
				case err := <-exited:
					if err != nil {
						t.Errorf("%s exited with %v", role, err)
					}
					if d := time.Since(stopped); d > 10*time.Second {
						t.Errorf("%s took %v to exit after its flows ended", role, d)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s still runs 10s after its last flow ended\n%s", role, n.Log(role))
				}
				if l := n.Log(role); !strings.Contains(l, "drained: every flow ended") {
					t.Errorf("%s's log does not say it drained:\n%s", role, l)
				}
			})
		}
	}

	// A routed chain moves off a relay that drains: new flows keep
	// working (the draining relay would refuse them) while the open one
	// finishes through it.
	t.Run("routed chain moves", func(t *testing.T) {
		n := procs.StartNet(t, bin, target, []string{"m1", "m2"},
			"{entry: hk, exit: la, via: [m1, m2], mode: sum, route: [hk, m1, la], probe: {interval: 500ms}}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.Listen, 4<<20, 2*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		p := n.Procs["m1"]
		p.Process.Signal(syscall.SIGTERM)
		exited := make(chan error, 1)
		go func() { exited <- procs.Wait(p) }()
		time.Sleep(100 * time.Millisecond) // the news reaches hk
		for i := range 5 {
			start := time.Now()
			if err := testutil.TCPExchange(func() (net.Conn, error) { return net.Dial("tcp", n.Listen) }, 10000); err != nil {
				t.Fatalf("new flow %d while m1 drains: %v\n%s", i, err, n.Log("hk"))
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("new flow %d while m1 drains took %v", i, d)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("the open transfer across m1's drain: %v", err)
		}
		l := n.Log("hk")
		_, moved, ok := strings.Cut(l, "from=hk,m1,la to=")
		if moved, _, _ = strings.Cut(moved, " "); !ok || strings.Contains(moved, "m1") {
			t.Errorf("hk's log shows no move off m1:\n%s", l)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("m1 still runs 10s after its last flow ended\n%s", n.Log("m1"))
		}
	})

	t.Run("second signal", func(t *testing.T) {
		n := procs.StartNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: quic}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.Listen, 4<<20, 3*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		p := n.Procs["m"]
		p.Process.Signal(syscall.SIGTERM)
		time.Sleep(200 * time.Millisecond)
		second := time.Now()
		p.Process.Signal(syscall.SIGTERM)
		exited := make(chan error, 1)
		go func() { exited <- procs.Wait(p) }()
		select {
		case <-exited:
			if d := time.Since(second); d > 2*time.Second {
				t.Errorf("a second signal took %v to stop the relay", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a second signal did not stop the draining relay")
		}
		if err := <-done; err == nil {
			t.Error("the transfer through a relay stopped at once completed; the second signal did not end its flows")
		}
	})
}
