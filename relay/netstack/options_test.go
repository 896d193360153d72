//go:build linux

package netstack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// TestTCPOptions checks that the stack's TCP runs what this package says:
// a benchmark names the congestion control of a tun Tunnel's client leg
// from CongestionControl.
func TestTCPOptions(t *testing.T) {
	s := stack.New(stack.Options{TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol}})
	defer s.Close()
	if err := setTCPOptions(s); err != nil {
		t.Fatal(err)
	}
	var cc tcpip.CongestionControlOption
	var sack tcpip.TCPSACKEnabled
	var moderate tcpip.TCPModerateReceiveBufferOption
	var rcv tcpip.TCPReceiveBufferSizeRangeOption
	var snd tcpip.TCPSendBufferSizeRangeOption
	for _, opt := range []tcpip.GettableTransportProtocolOption{&cc, &sack, &moderate, &rcv, &snd} {
		if err := s.TransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			t.Fatalf("%T: %v", opt, err)
		}
	}
	if string(cc) != CongestionControl {
		t.Errorf("congestion control %q, want %q", cc, CongestionControl)
	}
	if !bool(sack) || !bool(moderate) {
		t.Errorf("SACK %v, receive-buffer moderation %v; want both on", sack, moderate)
	}
	if rcv.Max != tcpBufMax || snd.Max != tcpBufMax || rcv.Default != tcpBufDefault || snd.Default != tcpBufDefault {
		t.Errorf("buffers: receive %+v, send %+v; want default %d, max %d", rcv, snd, tcpBufDefault, tcpBufMax)
	}
}
