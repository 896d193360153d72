package quic

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/pki"
)

// A clean path whose MTU is below quic-go's largest packet loses only path
// MTU discovery's probes, which quic-go does not count lost and the peer
// never receives: that is no loss of the link's. Counted, it made the link
// lossy for good (the peer said 3 packets missing, 4 with a handshake's).
// Both endpoints are in a namespace whose loopback carries 1,400 bytes.
func TestMTUProbesAreNoLoss(t *testing.T) {
	n, err := linkemu.NewNet(fmt.Sprintf("hlmtu%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	node, err := n.AddNode("x")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", node.NS, "link", "set", "lo", "mtu", "1400").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo mtu 1400: %v: %s", err, out)
	}
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	var a, b *Endpoint
	if err := node.Do(func() error {
		b = testEndpoint(t, ca, "b", make(chan *Conn, 300))
		a = testEndpoint(t, ca, "a", nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Traffic for 2.5 s: discovery is over, and its probes reported.
	for range 250 {
		if s, err := c.OpenStream(); err == nil {
			s.Write([]byte("hello"))
			s.Close()
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.lossCounts(); got.lost != 0 {
		t.Fatalf("a clean path of MTU 1400 shows %d of %d packets lost (quic-go's count %d, the peer's %d beyond the slack)",
			got.lost, got.sent, c.ConnectionStats().PacketsLost, c.peerLost.Load())
	}
}
