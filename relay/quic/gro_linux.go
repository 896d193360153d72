package quic

import (
	"encoding/binary"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// groConn gives quic-go a receive path with UDP GRO, which quic-go (GSO on
// send) lacks: the kernel hands over a run of a peer's same-size packets
// as one buffer with their segment size, where it would otherwise queue
// each packet as its own socket buffer (and count each against the
// receive buffer at several times its size). quic-go reads through
// ReadBatch when its connection has one; this one cuts the buffer into
// quic-go's packet buffers.
//
// quic-go reads from one goroutine, so the state of a read needs no lock.
type groConn struct {
	*lossyConn

	buf  []byte
	oob  []byte
	pend []byte // segments of the last read not handed out yet
	seg  int
	from *net.UDPAddr
	// fromAP is from as read: a run of reads from one peer shares one
	// from, where an address made per read was an allocation per packet.
	fromAP netip.AddrPort
	info   []byte // control messages of the last read, minus the GRO one
	// channel takes the datagram channel's packets (dgram.go), which
	// are not QUIC's; nil: quic-go gets them, and drops them.
	channel func([]byte)
}

// groBuffer holds the largest coalesced read (64 KiB of payload).
const groBuffer = 1 << 16

// withGRO turns GRO on for c, or returns c as it was where the kernel
// does not have it.
func withGRO(c *lossyConn) net.PacketConn {
	raw, err := c.SyscallConn()
	if err != nil {
		return c
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1)
	}); err != nil || serr != nil {
		return c
	}
	return &groConn{lossyConn: c, buf: make([]byte, groBuffer), oob: make([]byte, 256)}
}

// ReadBatch fills ms with the packets of one read, or of what is left of
// the last one.
func (g *groConn) ReadBatch(ms []ipv4.Message, _ int) (int, error) {
	n := 0
	for n < len(ms) {
		if len(g.pend) == 0 {
			if n > 0 {
				break
			}
			// Nothing left of the last read, or it held only the
			// channel's packets.
			if err := g.read(); err != nil {
				return 0, err
			}
		}
		k := min(g.seg, len(g.pend))
		if g.channel != nil && isChannelPacket(g.pend[:k]) {
			g.channel(g.pend[:k])
			g.pend = g.pend[k:]
			continue
		}
		m := &ms[n]
		m.N = copy(m.Buffers[0], g.pend[:k])
		m.NN = copy(m.OOB, g.info)
		m.Flags = 0
		m.Addr = g.from
		g.pend = g.pend[k:]
		n++
	}
	return n, nil
}

func (g *groConn) read() error {
	var n, oobn int
	var ap netip.AddrPort
	var err error
	if g.raw != nil {
		n, oobn, _, ap, err = g.raw.ReadMsg(g.buf, g.oob)
	} else {
		n, oobn, _, ap, err = g.ReadMsgUDPAddrPort(g.buf, g.oob)
	}
	if err != nil {
		return err
	}
	if g.from == nil || ap != g.fromAP {
		g.from, g.fromAP = net.UDPAddrFromAddrPort(ap), ap
	}
	g.pend, g.seg = g.buf[:n], n
	g.info = g.info[:0]
	// The control messages, walked in place (unix.ParseSocketControlMessage
	// allocates per read): the GRO one gives the segment size, the others
	// (ECN, packet info) go to quic-go as they came.
	oob := g.oob[:oobn]
	for len(oob) > 0 {
		if len(oob) < unix.SizeofCmsghdr {
			g.info = append(g.info[:0], g.oob[:oobn]...)
			break
		}
		h := (*unix.Cmsghdr)(unsafePointerOf(oob))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			g.info = append(g.info[:0], g.oob[:oobn]...)
			break
		}
		data := oob[unix.CmsgLen(0):l]
		next := min(unix.CmsgSpace(len(data)), len(oob))
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4 {
			if s := int(int32(binary.NativeEndian.Uint32(data))); s > 0 {
				g.seg = s
			}
		} else {
			g.info = append(g.info, oob[:next]...)
		}
		oob = oob[next:]
	}
	if g.seg <= 0 {
		g.seg = max(n, 1)
	}
	return nil
}

func unsafePointerOf(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// gsoSegment returns the UDP_SEGMENT size quic-go set in oob, or 0.
func gsoSegment(oob []byte) int {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafePointerOf(oob))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_SEGMENT && l >= unix.CmsgLen(2) {
			return int(binary.NativeEndian.Uint16(oob[unix.CmsgLen(0):]))
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return 0
}
