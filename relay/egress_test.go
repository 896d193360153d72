package relay_test

import (
	"io"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/egress"
)

// TestExitRefusesTheNode: with the node's egress policy (a host-network
// relay in a namespace not allowed the node), an exit connects no flow and
// no UDP session to the node's loopback, whatever the Tunnel says, and
// counts each as egress_refused; without it (standalone and local relays)
// the same Tunnels reach their targets.
func TestExitRefusesTheNode(t *testing.T) {
	tcpTarget := testutil.TCPServer(t, testutil.Echo)
	udpTarget := udpEcho(t)
	for _, policy := range []*egress.Policy{egress.NodePolicy(), nil} {
		tcpPort, udpPort := testutil.FreePort(t), testutil.FreePort(t)
		_, m, _ := networkWith(t, relay.Config{Egress: policy}, "quic", 2, []string{"r0", "r1"},
			testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: tcpTarget, Port: tcpPort},
			testutil.TunnelSpec{Name: "u", Protocol: "udp", Target: udpTarget, Port: udpPort})
		c := testutil.DialTunnel(t, tcpPort)
		c.Write([]byte("ping"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		_, tcpErr := io.ReadFull(c, buf)
		c.Close()
		udpErr := roundTrip(udpClient(t, udpPort), []byte("ping"))
		refusedTCP := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r1", "default/t", "egress_refused"))
		refusedUDP := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r1", "default/u", "egress_refused"))
		if policy == nil {
			if tcpErr != nil || udpErr != nil || refusedTCP+refusedUDP != 0 {
				t.Errorf("without the policy: tcp %v, udp %v, refused %v and %v", tcpErr, udpErr, refusedTCP, refusedUDP)
			}
			continue
		}
		if tcpErr == nil || udpErr == nil {
			t.Errorf("with the policy the node's loopback was reached: tcp %v, udp %v", tcpErr, udpErr)
		}
		if refusedTCP < 1 || refusedUDP < 1 {
			t.Errorf("egress_refused: tcp %v, udp %v; want both counted", refusedTCP, refusedUDP)
		}
	}
}
