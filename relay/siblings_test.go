package relay_test

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/metrics"
)

// Stalled flows hold their unread bytes in the QUIC connection window of
// their Tunnel. On a loopback link about 130 of them filled it, and then
// no new flow of the Tunnel got a byte; these tests stall three times as
// many, one after the other, and every new client must still get its
// first bytes within a second (stallBound), or on a host busy with other
// work within three (stallLimit) for at most one in fifty. No stalled flow
// may be reset while the window holds them all: none among the first
// stallSafe. Each relay that writes the stalled flows to a QUIC connection
// must reset some, counted as stalled where it did; a relay that writes
// them to a socket has no window to free and resets none.
const (
	stallClients = 400
	stallSafe    = 100
	stallBound   = time.Second
	stallLimit   = 3 * time.Second
)

// TestStalledFlowsDoNotStarveTheirTunnel: clients of one Tunnel read the
// start of an endless download and stop reading (slow clients, a stuck
// consumer). The exit, which writes to the stalled streams, resets the
// longest stalled one when a new flow's first bytes wait for the window.
func TestStalledFlowsDoNotStarveTheirTunnel(t *testing.T) {
	for _, tr := range []string{"quic", "auto"} {
		t.Run(tr, func(t *testing.T) {
			endless := testutil.TCPServer(t, func(c *net.TCPConn) {
				c.SetWriteBuffer(64 << 10) // the host's memory: 400 of them
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			})
			port := testutil.FreePort(t)
			route := []string{"r0", "r1"}
			_, m, _ := networkOver(t, tr, 2, route, testutil.TunnelSpec{Name: "down", Protocol: "tcp", Target: endless, Port: port})
			stallSiblings(t, m, route, []string{"r1"}, "default/down", func(i int) error {
				c := testutil.DialTunnel(t, port)
				t.Cleanup(func() { c.Close() })
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := io.ReadFull(c, make([]byte, 64<<10))
				return err
			})
		})
	}
}

// TestStalledUploadsDoNotStarveTheirTunnel: clients of one Tunnel upload
// without end to a target that greets each, reads its first 64 KiB,
// answers and reads no more. The relay that writes the stalled uploads
// toward the target resets the longest stalled one when a new upload's
// first bytes wait; through a middle relay, both the entry and the middle
// do, each for its own connection: the middle's connection to the exit
// fills as the entry's does, and the entry's resets free only the entry's.
// A client that waits for the greeting before it sends a byte (a server
// that speaks first) must get it too: its flow's header is its first
// bytes.
func TestStalledUploadsDoNotStarveTheirTunnel(t *testing.T) {
	for _, route := range [][]string{{"r0", "r1"}, {"r0", "r1", "r2"}} {
		t.Run(strings.Join(route, "-"), func(t *testing.T) {
			stop := make(chan struct{})
			target := testutil.TCPServer(t, func(c *net.TCPConn) {
				c.SetReadBuffer(64 << 10)
				c.Write([]byte("hi"))
				if _, err := io.ReadFull(c, make([]byte, 64<<10)); err != nil {
					return
				}
				c.Write([]byte("ok"))
				<-stop // and read no more
			})
			t.Cleanup(func() { close(stop) })
			port := testutil.FreePort(t)
			_, m, _ := networkOver(t, "quic", len(route), route, testutil.TunnelSpec{Name: "up", Protocol: "tcp", Target: target, Port: port})
			chunk := make([]byte, 64<<10)
			upload := func(i int) error {
				c := testutil.DialTunnel(t, port)
				c.SetWriteBuffer(64 << 10)
				t.Cleanup(func() { c.Close() })
				go func() {
					for {
						if _, err := c.Write(chunk); err != nil {
							return
						}
					}
				}()
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := io.ReadFull(c, make([]byte, 4))
				return err
			}
			// Every relay but the exit writes the uploads to a QUIC
			// connection; the exit writes them to the target's socket.
			stallSiblings(t, m, route, route[:len(route)-1], "default/up", upload)
			// An upload past its first bytes takes what credit is left,
			// so after some the window is full to the byte: then only the
			// silent client's header could ask for a reset.
			var worst time.Duration
			for i := range 40 {
				if err := upload(stallClients + i); err != nil {
					t.Fatalf("upload %d: %v", stallClients+i, err)
				}
				start := time.Now()
				c := testutil.DialTunnel(t, port)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := io.ReadFull(c, make([]byte, 2))
				d := time.Since(start)
				c.Close()
				if err != nil || d > stallLimit {
					t.Fatalf("a client that waits for the target to speak first (%d): %v after %v", i, err, d)
				}
				worst = max(worst, d)
			}
			t.Logf("clients that wait for the target to speak first: greeted within %v", worst.Round(time.Millisecond))
		})
	}
}

// stallSiblings runs stallClients clients of a Tunnel one after the other,
// each left stalled by first, which returns once the client got its first
// bytes. Each must take under a second; none may be reset while the first
// stallSafe stall. Each relay of resetting must then reset some and no
// more than the rest; the other relays none.
func stallSiblings(t *testing.T, m *metrics.Metrics, relays, resetting []string, tunnel string, first func(i int) error) {
	t.Helper()
	resetAt := func(r string) float64 {
		return promtest.ToFloat64(m.FlowErrors.WithLabelValues(r, tunnel, "stalled"))
	}
	resets := func() (n float64) {
		for _, r := range relays {
			n += resetAt(r)
		}
		return n
	}
	var worst time.Duration
	var slow []string
	for i := range stallClients {
		start := time.Now()
		if err := first(i); err != nil {
			t.Fatalf("client %d: no first bytes: %v (after %v, %v stalled flows reset)", i, err, time.Since(start), resets())
		}
		d := time.Since(start)
		worst = max(worst, d)
		if d > stallBound {
			slow = append(slow, fmt.Sprintf("%d: %v", i, d.Round(time.Millisecond)))
		}
		if d > stallLimit {
			t.Errorf("client %d waited %v for its first bytes", i, d)
		}
		if i+1 == stallSafe {
			if n := resets(); n > 0 {
				t.Fatalf("%v stalled flows reset while %d stalled", n, stallSafe)
			}
		}
		if (i+1)%50 == 0 {
			t.Logf("%d stalled clients, %v reset; the last waited %v", i+1, resets(), d.Round(time.Millisecond))
		}
	}
	n := resets()
	var each []string
	for _, r := range relays {
		each = append(each, fmt.Sprintf("%s %v", r, resetAt(r)))
	}
	// What is live after a collection is the relays', nearly all: the
	// clients hold their sockets only.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d stalled clients: %v reset (%s), worst first bytes %v; live heap %d MiB",
		stallClients, n, strings.Join(each, ", "), worst.Round(time.Millisecond), ms.HeapAlloc>>20)
	if len(slow) > stallClients/50 {
		t.Errorf("%d clients waited over %v for their first bytes: %v", len(slow), stallBound, slow)
	}
	for _, r := range relays {
		n := resetAt(r)
		switch {
		case !slices.Contains(resetting, r) && n > 0:
			t.Errorf("%s reset %v stalled flows, with no QUIC connection to write them to", r, n)
		case slices.Contains(resetting, r) && (n == 0 || n > stallClients-stallSafe):
			t.Errorf("%s reset %v stalled flows, want 1 to %d", r, n, stallClients-stallSafe)
		}
	}
}
