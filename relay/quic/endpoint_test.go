package quic

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/pki"
)

// The buffers quic-go obtained are exported, so a node whose rmem_max
// caps them shows it.
func TestSocketBuffersAreReported(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	e := testEndpoint(t, ca, "a", make(chan *Conn, 1))
	for _, dir := range []string{"receive", "send"} {
		if v := testutil.ToFloat64(e.opts.Metrics.UDPBuffer.WithLabelValues("a", dir)); v < 64<<10 {
			t.Errorf("%s buffer reported as %v bytes", dir, v)
		}
	}
}

// With a dial port of its own, links leave from another port than the
// relay port; without, from the relay port.
func TestSeparateDialPort(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	e := testEndpoint(t, ca, "a", make(chan *Conn, 1))
	if e.dialUDP != e.udp || e.dialTr != e.tr {
		t.Error("without SeparateDialPort, links must leave from the relay port")
	}
	id, _ := ca.Identity("b")
	sep, err := Listen(Options{Name: "b", Identity: id, Listen: "127.0.0.1:0", SeparateDialPort: true,
		Peers: testPeers, Metrics: e.opts.Metrics, Log: e.opts.Log})
	if err != nil {
		t.Fatal(err)
	}
	defer sep.Close()
	if sep.dialUDP.LocalAddr().String() == sep.udp.LocalAddr().String() || sep.dialTr == sep.tr {
		t.Errorf("with SeparateDialPort, links leave from %v, the relay port", sep.dialUDP.LocalAddr())
	}
}
