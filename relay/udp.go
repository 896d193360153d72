package relay

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// udpFlows carries UDP sessions in every role: the entry (udpentry.go),
// the middle (udpmiddle.go) and the exit (udpexit.go). A session is one
// client address of a UDP Tunnel (or one source and destination of a tun
// Tunnel's stack); over each hop it is a nexthop.Session: datagrams over
// QUIC, frames over TLS, and the hop's stream that marks its life.
type udpFlows struct {
	*env
	hops   *nexthop.Hops
	routes *routeBook
	// exits counts the sessions of each Tunnel this relay ends at their
	// target, which spec.udp.maxSessions bounds here as at the entry.
	exits sessionSlots
	// echoes counts the echo sessions of each flow-mode tun Tunnel this
	// relay is the exit of.
	echoes sessionSlots
}

// pendingPackets bounds what a session queues while its stream is opening.
const pendingPackets = 32

// hopBroken says whether a UDP session's hop ended in error rather than
// as sessions end: reset by the relay beside this one (it lost its own
// next hop or died), its connection lost, a TLS hop cut. An idle end, a
// shutdown notice and a TLS close_notify are ends; a session refused at
// setup is counted where it was refused.
func hopBroken(err error) bool {
	if err == nil || errors.Is(err, io.EOF) {
		return false
	}
	if code, _, ok := flow.ResetCode(err); ok {
		return code != hop.CodeIdle && code != hop.CodeShutdown && code != hop.CodeRejected && code != hop.CodeDialFailed
	}
	return true
}

// dialUDP connects a socket to a UDP target that the egress policy p
// allows (nil: any).
func dialUDP(p *egress.Policy, target string) (*net.UDPConn, error) {
	raddr, err := p.ResolveUDP(target)
	if err != nil {
		return nil, err
	}
	c, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil, err
	}
	sizeUDP(c)
	return c, nil
}

// udpSocketBuffer is the kernel buffer of every tunnel socket. A client that sends in bursts
// outruns a relay busy forwarding the previous burst; the kernel's default (about 200 KiB)
// overflows in under 2 ms at 1 Gbit/s. The kernel caps it at net.core.rmem_max/wmem_max.
const udpSocketBuffer = 4 << 20

func sizeUDP(c *net.UDPConn) {
	_ = c.SetReadBuffer(udpSocketBuffer)
	_ = c.SetWriteBuffer(udpSocketBuffer)
}

// udpMode is how a Tunnel's sessions send their packets.
func udpMode(t *v1alpha1.Tunnel) nexthop.Mode {
	if u := t.Spec.UDP; u != nil {
		switch u.Mode {
		case v1alpha1.UDPDatagram:
			return nexthop.Datagrams
		case v1alpha1.UDPStream:
			return nexthop.Frames
		}
	}
	return nexthop.Auto
}

// framed is told when a session of tunnel turns to stream mode.
func (f *udpFlows) framed(tunnel, role, peer string) func() {
	return func() {
		f.m.UDPFramed.WithLabelValues(f.name, tunnel, role).Inc()
		f.log.Info("udp session turned to stream mode", "tunnel", tunnel, "role", role, "peer", peer,
			"rate_over", nexthop.AutoFramesRate)
	}
}

// udpIdle is how long a UDP session of the Tunnel lives without traffic:
// its spec's, or the default for a tun Tunnel's UDP flows.
func udpIdle(t *v1alpha1.Tunnel) time.Duration {
	if t.Spec.UDP != nil && t.Spec.UDP.IdleTimeoutSeconds > 0 {
		return time.Duration(t.Spec.UDP.IdleTimeoutSeconds) * time.Second
	}
	return v1alpha1.DefaultUDPIdleTimeout * time.Second
}

// errorsIsClosed reports errors that only say a socket was closed under us.
func errorsIsClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
