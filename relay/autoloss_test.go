package relay_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestAutoFreshTunnelOnALossyLink: once a relay has seen its link to the
// next lose packets (here through another Tunnel's echoes, which turn
// QUIC's copies on), the first flow of a Tunnel it knows nothing of rides
// QUIC (lossy_link), where TCP would wait out a retransmission timeout for
// each lost request or answer; and a Tunnel whose first flow moved bulk
// sends its next one over the link's bulk transport, TLS before
// measurement. Only the relays' UDP crosses the emulated loss: QUIC's
// packet counts are what show it here.
func TestAutoFreshTunnelOnALossyLink(t *testing.T) {
	echo := testutil.EchoServer(t)
	sink := testutil.TCPServer(t, func(c *net.TCPConn) {
		defer c.Close()
		io.Copy(io.Discard, c)
	})
	warm, rr, bulk := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	e := startEmulated(t, []string{"r0", "r1"}, nil, fmt.Sprintf(`---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: q}
spec: {entry: r0, exit: r1, route: [r0, r1], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: a}
spec: {entry: r0, exit: r1, route: [r0, r1], transport: auto}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: warm}
spec: {chain: q, listen: {address: 127.0.0.1, port: %d}, target: %q}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: rr}
spec: {chain: a, listen: {address: 127.0.0.1, port: %d}, target: %q}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: bulk}
spec: {chain: a, listen: {address: 127.0.0.1, port: %d}, target: %q}
`, warm, echo, rr, echo, bulk, sink))
	lossy := linkemu.Params{Delay: 200 * time.Microsecond, Loss: 0.05}
	e.proxies["r1"].SetFrom(e.addrs["r0"], lossy, lossy)
	e.proxies["r0"].SetFrom(e.addrs["r1"], lossy, lossy)
	// TLS reaches each relay on the TCP port of its endpoint's number,
	// clean: a proxy byte stream cannot lose packets.
	for name, p := range e.proxies {
		tp, err := linkemu.NewTCPProxy(p.Addr(), e.addrs[name], linkemu.Params{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tp.Close() })
	}

	echoes := func(port, n int) {
		t.Helper()
		c := testutil.DialTunnel(t, port)
		defer c.Close()
		msg, buf := bytes.Repeat([]byte{'q'}, 1000), make([]byte, 1000)
		for range n {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	flows := func(transport, reason string) float64 {
		v, _ := e.gauge("hoplink_link_flows_total", map[string]string{"from": "r0", "to": "r1", "transport": transport, "reason": reason})
		return v
	}
	// The warm Tunnel's echoes show r0 that the link loses packets.
	deadline := time.Now().Add(20 * time.Second)
	for {
		echoes(warm, 100)
		if v, _ := e.gauge("hoplink_quic_redundant_packets_total", map[string]string{"relay": "r0"}); v > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("r0 never sent a copy over a link that loses 5% of its packets")
		}
	}

	echoes(rr, 100)
	if n := flows("quic", "lossy_link"); n != 1 {
		t.Fatalf("the first flow of a fresh Tunnel: %v flows over QUIC for a lossy link, want 1", n)
	}

	// A bulk Tunnel's first flow rides QUIC as well, and says what it is.
	send := func() {
		t.Helper()
		c := testutil.DialTunnel(t, bulk)
		defer c.Close()
		if _, err := io.Copy(c, testutil.RandReader(1, 2<<20)); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		io.Copy(io.Discard, c) // until the sink closes
	}
	send()
	if n := flows("quic", "lossy_link"); n != 2 {
		t.Fatalf("the first flow of a fresh bulk Tunnel: %v flows over QUIC for a lossy link in all, want 2", n)
	}
	// r0 learns of the flow's end once its own side has ended.
	deadline = time.Now().Add(10 * time.Second)
	for {
		if v, ok := e.gauge("hoplink_tunnel_active_flows", map[string]string{"relay": "r0", "tunnel": "default/bulk", "role": "entry"}); ok && v == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("r0 never saw the bulk flow end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	send()
	if n := flows("tls", "unmeasured"); n != 1 {
		t.Fatalf("the second flow of a bulk Tunnel: %v flows over TLS, want 1 (QUIC for a lossy link: %v)", n, flows("quic", "lossy_link"))
	}
}
