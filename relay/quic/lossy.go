package quic

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/relay/sockio"
)

// lossyConn is the relay's UDP socket as quic-go sees it. A send that the
// host refuses for a moment (a local firewall's drop or rate limit, and a
// full conntrack table, answer EPERM; a full device queue ENOBUFS) is a
// packet lost, which QUIC recovers like any other loss. Returned as an
// error it would make quic-go close the connection at once, without a
// CONNECTION_CLOSE, and every flow between the two relays with it: one
// dropped packet must cost a retransmission, never a link. Other errors
// (too large for the path, GSO unsupported) go to quic-go, which handles
// them.
type lossyConn struct {
	*net.UDPConn
	// lost counts a send swallowed as a loss, by reason.
	lost func(reason string)
	// red says which lone packets go twice (redundant.go); nil: none.
	red *redundancy
	// raw sends and receives quic-go's packets in raw system calls
	// (package sockio); nil where there are none.
	raw *sockio.UDP
}

// newLossyConn makes c the relay's socket as quic-go sees it.
func newLossyConn(c *net.UDPConn, red *redundancy, lost func(reason string)) *lossyConn {
	l := &lossyConn{UDPConn: c, red: red, lost: lost}
	l.raw, _ = sockio.NewUDP(c)
	return l
}

// lostReason names a transient send error, or returns "" for any other.
func lostReason(err error) string {
	switch {
	case errors.Is(err, unix.EPERM):
		return "eperm"
	case errors.Is(err, unix.ENOBUFS):
		return "enobufs"
	case errors.Is(err, unix.EAGAIN):
		return "eagain"
	}
	return ""
}

func (c *lossyConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	n, oobn, err := c.writeMsg(b, oob, addr)
	if reason := lostReason(err); reason != "" {
		c.lost(reason)
		return len(b), len(oob), nil
	}
	if err == nil && c.again(addr, len(b), oob) {
		c.writeMsg(b, oob, addr) // a copy that fails is a copy lost
	}
	return n, oobn, err
}

// writeMsg sends to addr as a netip.AddrPort: net's WriteMsgUDP makes a
// socket address on the heap for every packet, its AddrPort form does not.
func (c *lossyConn) writeMsg(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	if addr == nil {
		return c.UDPConn.WriteMsgUDP(b, oob, nil)
	}
	ap := addr.AddrPort()
	if c.raw != nil && c.raw.Sends(ap) {
		return c.raw.WriteMsg(b, oob, ap)
	}
	if a := ap.Addr(); a.Is4In6() {
		// An IPv4 socket takes only the 4-byte form.
		ap = netip.AddrPortFrom(a.Unmap(), ap.Port())
	}
	return c.UDPConn.WriteMsgUDPAddrPort(b, oob, ap)
}

func (c *lossyConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.UDPConn.WriteTo(b, addr)
	if reason := lostReason(err); reason != "" {
		c.lost(reason)
		return len(b), nil
	}
	if ua, ok := addr.(*net.UDPAddr); ok && err == nil && c.again(ua, len(b), nil) {
		c.UDPConn.WriteTo(b, addr)
	}
	return n, err
}

// again says whether the packet just sent should go a second time: a lone
// packet (not a GSO batch) to an address that loses packets, within its
// budget.
func (c *lossyConn) again(addr *net.UDPAddr, n int, oob []byte) bool {
	if c.red == nil || !c.red.any.Load() || addr == nil {
		return false
	}
	if seg := gsoSegment(oob); seg > 0 && n > seg {
		return false
	}
	return c.red.copy(addr.AddrPort(), time.Now())
}
