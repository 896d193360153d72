package relay_test

import (
	"fmt"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestPeerUpFollowsTheProbes: a next hop that goes silent (killed, or cut
// off) is counted down in hoplink_peer_up by the probe round that finds
// its link down, not only once QUIC's idle timeout ends the connection.
func TestPeerUpFollowsTheProbes(t *testing.T) {
	exitPort := testutil.FreePort(t)
	proxy, err := linkemu.NewUDPProxy("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", exitPort), linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"},
		Tunnels: []testutil.TunnelSpec{{Name: "t", Protocol: "tcp", Target: "127.0.0.1:9", Port: testutil.FreePort(t)}},
		Ports:   map[string]int{"r1": exitPort}, Endpoints: map[string]string{"r1": proxy.Addr()}})
	peerUp := func() float64 { return promtest.ToFloat64(m.PeerUp.WithLabelValues("r0", "r1")) }
	linkUp := func() float64 { return promtest.ToFloat64(m.LinkUp.WithLabelValues("r0", "r1")) }
	waitMetric(t, "r0 counts r1 up", func() bool { return peerUp() == 1 && linkUp() == 1 })
	proxy.Set(linkemu.Params{Loss: 1}) // r1 goes silent
	waitMetric(t, "r0's probes find the link down", func() bool { return linkUp() == 0 })
	if v := peerUp(); v != 0 {
		t.Errorf("link_up 0, peer_up %v: want peer_up to follow the probes", v)
	}
	proxy.Set(linkemu.Params{})
	waitMetric(t, "r1 back up", func() bool { return peerUp() == 1 && linkUp() == 1 })
}

func waitMetric(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
	}
}
