package relay

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestOneSilentRoundRefusesNoFlow: the entry's next hop answered no probe
// of one round (its probes lost in a full queue, or answered late on a
// busy host) while its connection stays up and carries everything else.
// A fixed route has nowhere else to go: its new flows must be carried,
// not reset at the entry's listener until the next round.
func TestOneSilentRoundRefusesNoFlow(t *testing.T) {
	for _, transport := range []string{"quic", "tls"} {
		t.Run(transport, func(t *testing.T) {
			target := testutil.EchoServer(t)
			port := testutil.FreePort(t)
			n := startNetwork(t, []string{"hk", "la"}, fmt.Sprintf(`---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la], transport: %s}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: %q}
`, transport, port, target))
			n.linked(t, "hk", "la")
			exchange := func() error {
				c := testutil.DialTunnel(t, port)
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write([]byte("ping")); err != nil {
					return err
				}
				var b [4]byte
				_, err := io.ReadFull(c, b[:])
				return err
			}
			if err := exchange(); err != nil {
				t.Fatalf("before: %v", err)
			}
			// A round of probes went unanswered; the connection is up.
			n.relays["hk"].peers.Answering("la", false)
			if n.relays["hk"].peers.Live("la") == nil {
				t.Fatal("the link went down")
			}
			for i := range 3 {
				if err := exchange(); err != nil {
					t.Fatalf("flow %d after one silent probe round, over a live link: %v", i, err)
				}
			}
		})
	}
}
