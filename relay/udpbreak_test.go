package relay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay"
)

// brokenCounts are a Tunnel's UDP sessions counted broken at each relay
// of r0 -> r1 -> r2, by the side that failed.
func brokenCounts(m *metrics.Metrics, tunnel string) string {
	var b strings.Builder
	for _, r := range []string{"r0", "r1", "r2"} {
		for _, side := range []string{"prev_hop_reset", "next_hop_reset"} {
			if v := promtest.ToFloat64(m.FlowErrors.WithLabelValues(r, tunnel, side)); v > 0 {
				fmt.Fprintf(&b, "%s %s=%v ", r, side, v)
			}
		}
	}
	return strings.TrimSpace(b.String())
}

// sessionsOpen is the Tunnel's open sessions at every relay together.
func sessionsOpen(m *metrics.Metrics) float64 {
	var sum float64
	for _, r := range []string{"r0", "r1", "r2"} {
		for _, role := range []string{"entry", "middle", "exit"} {
			sum += promtest.ToFloat64(m.UDPSessions.WithLabelValues(r, "default/u", role))
		}
	}
	return sum
}

// TestUDPSessionsEndWithoutErrors: a session that times out ends at every
// relay of its route as an end, over QUIC and over TLS: no relay counts it
// broken. (The counting of broken sessions below must not cry wolf.)
func TestUDPSessionsEndWithoutErrors(t *testing.T) {
	for _, transport := range []string{"quic", "tls"} {
		t.Run(transport, func(t *testing.T) {
			port := testutil.FreePort(t)
			_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 3, Route: []string{"r0", "r1", "r2"}, Transport: transport,
				Tunnels: []testutil.TunnelSpec{{Name: "u", Protocol: "udp", Target: udpEcho(t), Port: port, Extra: ", udp: {idleTimeoutSeconds: 1}"}}})
			c := udpClient(t, port)
			if err := roundTrip(c, []byte("hello")); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); sessionsOpen(m) > 0; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("sessions still open 10s after they went idle for 1s: %v", sessionsOpen(m))
				}
			}
			time.Sleep(200 * time.Millisecond) // the last relay's count, if any
			if got := brokenCounts(m, "default/u"); got != "" {
				t.Errorf("a session that timed out was counted broken: %s", got)
			}
		})
	}
}

// TestUDPSessionBrokenIsCounted: the link from the entry r0 to the middle
// r1 goes dark (every packet lost, as when r1's host dies) while a UDP
// session crosses it. Each relay counts the session broken under the side
// that failed: r0 its next hop, r1 and the exit r2 their previous one;
// then the client's next datagrams, which no session can carry (the route
// is fixed), are counted dropped at the entry, not lost in silence.
func TestUDPSessionBrokenIsCounted(t *testing.T) {
	port, midPort := testutil.FreePort(t), testutil.FreePort(t)
	midAddr := fmt.Sprintf("127.0.0.1:%d", midPort)
	dark, err := linkemu.NewUDPProxy("127.0.0.1:0", midAddr, linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dark.Close() })
	_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 3, Route: []string{"r0", "r1", "r2"},
		Tunnels: []testutil.TunnelSpec{{Name: "u", Protocol: "udp", Target: udpEcho(t), Port: port}},
		Ports:   map[string]int{"r1": midPort}, Endpoints: map[string]string{"r1": dark.Addr()}})
	c := udpClient(t, port)
	if err := roundTrip(c, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if got := brokenCounts(m, "default/u"); got != "" {
		t.Fatalf("counted broken before anything broke: %s", got)
	}

	dark.Set(linkemu.Params{Loss: 1})
	want := "r0 next_hop_reset=1 r1 prev_hop_reset=1 r2 prev_hop_reset=1"
	dropped := func() float64 {
		return promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/u", "setup_failed"))
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		c.Write([]byte("after"))
		got := brokenCounts(m, "default/u")
		if got == want && dropped() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after the link went dark: broken %q (want %q), datagrams dropped at setup %v (want some)", got, want, dropped())
		}
	}
}
