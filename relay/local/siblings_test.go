package local

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testutil"
)

// TestStalledFlowsDoNotStarveTheirTunnel: 64 clients of one Tunnel read
// the start of an endless download and stop reading (slow clients, a stuck
// consumer). Their unread bytes wait in the relays, but the next client of
// the same Tunnel must still get its first bytes within a second.
func TestStalledFlowsDoNotStarveTheirTunnel(t *testing.T) {
	for _, tr := range []string{"quic", "auto"} {
		t.Run(tr, func(t *testing.T) {
			endless := testutil.TCPServer(t, func(c *net.TCPConn) {
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			})
			port := testutil.FreePort(t)
			networkOver(t, tr, 2, []string{"r0", "r1"}, tunnelSpec{name: "down", protocol: "tcp", target: endless, port: port})
			first := func(i int) time.Duration {
				start := time.Now()
				c := dialTunnel(t, port)
				t.Cleanup(func() { c.Close() })
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadFull(c, make([]byte, 64<<10)); err != nil {
					t.Fatalf("client %d: no first 64 KiB: %v (after %v)", i, err, time.Since(start))
				}
				return time.Since(start)
			}
			var worst time.Duration
			for i := range 64 {
				d := first(i)
				worst = max(worst, d)
				if i%16 == 15 {
					t.Logf("%d stalled clients; the last took %v", i+1, d)
				}
			}
			time.Sleep(time.Second) // let the stalled flows fill what they can
			if d := first(64); d > time.Second || worst > time.Second {
				t.Fatalf("a new client waited %v for its first bytes beside 64 stalled ones (worst before: %v)", d, worst)
			}
		})
	}
}
