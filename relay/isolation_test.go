package relay_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestStalledTunnelDoesNotStallAnother: clients of one Tunnel that stop
// reading (and uploads into a target that never reads) leave data unread
// in the relays' QUIC streams, which counts against a connection's flow
// control window. Another Tunnel between the same two relays must not
// wait for them: its 4 MiB transfers finish as fast as they do alone.
func TestStalledTunnelDoesNotStallAnother(t *testing.T) {
	endless := testutil.TCPServer(t, func(c *net.TCPConn) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit) })
	deaf := testutil.TCPServer(t, func(c *net.TCPConn) { <-quit }) // accepts, never reads
	const size = 4 << 20
	fast := testutil.TCPServer(t, func(c *net.TCPConn) {
		var mode [1]byte
		if _, err := io.ReadFull(c, mode[:]); err != nil {
			return
		}
		if mode[0] == 'd' {
			io.Copy(c, testutil.RandReader(3, size))
			return
		}
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d", n)
	})
	pDown, pUp, pFast := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	network(t, 2, []string{"r0", "r1"},
		testutil.TunnelSpec{Name: "stalled-down", Protocol: "tcp", Target: endless, Port: pDown},
		testutil.TunnelSpec{Name: "stalled-up", Protocol: "tcp", Target: deaf, Port: pUp},
		testutil.TunnelSpec{Name: "other", Protocol: "tcp", Target: fast, Port: pFast})

	transfer := func(mode byte) time.Duration {
		t.Helper()
		start := time.Now()
		c := testutil.DialTunnel(t, pFast)
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		c.Write([]byte{mode})
		if mode == 'd' {
			n, err := io.Copy(io.Discard, c)
			if err != nil || n != size {
				t.Fatalf("download: %d bytes, %v", n, err)
			}
		} else {
			io.Copy(c, testutil.RandReader(4, size))
			c.CloseWrite()
			b, err := io.ReadAll(c)
			if err != nil || string(b) != fmt.Sprint(size) {
				t.Fatalf("upload: answer %q, %v", b, err)
			}
		}
		return time.Since(start)
	}
	alone := max(transfer('d'), transfer('u'))

	// Eight clients that stop reading, eight uploads nobody reads.
	for range 8 {
		c := testutil.DialTunnel(t, pDown)
		defer c.Close()
		c.Write([]byte("go"))
		u := testutil.DialTunnel(t, pUp)
		defer u.Close()
		go io.Copy(u, testutil.RandReader(5, 1<<30))
	}
	time.Sleep(3 * time.Second) // their streams fill up
	for _, mode := range []byte{'d', 'u'} {
		if d := transfer(mode); d > 2*time.Second+4*alone {
			t.Fatalf("a %c transfer of 4 MiB took %v next to the stalled Tunnels (%v alone)", mode, d, alone)
		}
	}
}
