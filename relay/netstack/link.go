//go:build linux

package netstack

import (
	"encoding/binary"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/hoplink/hoplink/relay/tun"
)

// virtio-net header (struct virtio_net_hdr), which precedes every packet on
// a TUN device opened with IFF_VNET_HDR.
const (
	vnetHdrLen          = 10
	vnetFlagNeedsCsum   = 1
	vnetGSONone         = 0
	vnetGSOTCPv4        = 1
	vnetGSOUDPL4        = 5
	vnetGSOTCPv6        = 4
	maxSuperPacket      = 65535
	linkEndpointGSOSize = 1 << 16
)

// link is the stack's link endpoint on the device. With offload, it moves
// super-packets both ways: the kernel's 64 KiB TCP segments go to the stack
// whole (TCP takes segments of any size; their checksums are the kernel's
// partial ones, so they count as validated), and the stack's own large
// segments go out with a virtio-net GSO header for the kernel to cut. That
// is where offload is handled, once.
type link struct {
	f       *os.File
	mtu     uint32
	offload bool
	stats   *Stats
	allowed func(netip.Addr) bool

	mu         sync.Mutex
	dispatcher stack.NetworkDispatcher
	onClose    func()
	done       chan struct{}
	closed     atomic.Bool
}

func newLink(f *os.File, mtu int, offload bool, allowed func(netip.Addr) bool, stats *Stats) *link {
	return &link{f: f, mtu: uint32(mtu), offload: offload, allowed: allowed, stats: stats, done: make(chan struct{})}
}

func (l *link) MTU() uint32                      { return l.mtu }
func (l *link) SetMTU(mtu uint32)                { l.mtu = mtu }
func (l *link) MaxHeaderLength() uint16          { return 0 }
func (l *link) LinkAddress() tcpip.LinkAddress   { return "" }
func (l *link) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities says that received checksums need no check: every packet
// comes from the local kernel, complete or (with offload) partial, which
// the NIC cannot tell apart per packet.
func (l *link) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}
func (l *link) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }
func (l *link) AddHeader(*stack.PacketBuffer)           {}
func (l *link) ParseHeader(*stack.PacketBuffer) bool    { return true }

// GSOMaxSize and SupportedGSO make the stack build super-segments.
func (l *link) GSOMaxSize() uint32 {
	if l.offload {
		return linkEndpointGSOSize
	}
	return 0
}

func (l *link) SupportedGSO() stack.SupportedGSO {
	if l.offload {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

func (l *link) IsAttached() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dispatcher != nil
}

func (l *link) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	l.dispatcher = d
	l.mu.Unlock()
}

// start begins reading the device. The stack calls Attach as the NIC is
// created, before its transport handlers are set; reading from then on
// would hand packets to a stack still being built.
func (l *link) start() { go l.read() }

func (l *link) Wait() { <-l.done }

func (l *link) SetOnCloseAction(f func()) {
	l.mu.Lock()
	l.onClose = f
	l.mu.Unlock()
}

// Close stops reading; the device itself is closed by its owner, which
// ends the read in progress.
func (l *link) Close() {
	if l.closed.Swap(true) {
		return
	}
	l.mu.Lock()
	f := l.onClose
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// read delivers the device's packets to the stack until the device closes.
func (l *link) read() {
	defer close(l.done)
	buf := make([]byte, vnetHdrLen+maxSuperPacket)
	var failures tun.ReadFailures
	for {
		n, err := l.f.Read(buf)
		if failures.Gone(err) || err != nil && l.closed.Load() {
			if !l.closed.Load() {
				l.stats.drop("device_gone")
			}
			return
		}
		if err != nil {
			continue // a packet the kernel failed to hand over
		}
		pkt := buf[:n]
		if l.offload {
			if n < vnetHdrLen {
				l.stats.drop("malformed")
				continue
			}
			gso := pkt[1]
			pkt = pkt[vnetHdrLen:]
			if gso == vnetGSOUDPL4 {
				// The device offers no UDP segmentation (see Stack), so
				// this cannot happen; a UDP super-packet must not reach
				// the stack as one datagram.
				l.stats.drop("unsupported_gso")
				continue
			}
		}
		if len(pkt) == 0 {
			continue
		}
		var proto tcpip.NetworkProtocolNumber
		switch pkt[0] >> 4 {
		case 4:
			proto = header.IPv4ProtocolNumber
		case 6:
			proto = header.IPv6ProtocolNumber
		default:
			l.stats.drop("not_ip")
			continue
		}
		l.stats.in(1, len(pkt))
		if reply := tun.EchoReply(pkt); reply != nil {
			// Pings to the Tunnel's destinations are answered here; the
			// stack would not answer for addresses it only borrows.
			if _, dst, err := tun.Addresses(pkt); err == nil && l.allowed(dst) {
				l.stats.flow("icmp")
				l.writeRaw(reply)
			} else {
				l.stats.drop("not_routed")
			}
			continue
		}
		p := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)})
		l.mu.Lock()
		d := l.dispatcher
		l.mu.Unlock()
		if d != nil {
			d.DeliverNetworkPacket(proto, p)
		}
		p.DecRef()
	}
}

// writeRaw writes one packet with complete checksums.
func (l *link) writeRaw(pkt []byte) {
	var hdr [vnetHdrLen]byte
	parts := [][]byte{pkt}
	if l.offload {
		parts = [][]byte{hdr[:], pkt}
	}
	sc, err := l.f.SyscallConn()
	if err != nil {
		return
	}
	var werr error
	sc.Write(func(fd uintptr) bool {
		_, werr = unix.Writev(int(fd), parts)
		return werr != unix.EAGAIN
	})
	if werr != nil {
		l.stats.drop("write_failed")
		return
	}
	l.stats.out(1, len(pkt))
}

// WritePackets hands the stack's packets to the device, one write each.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	sc, err := l.f.SyscallConn()
	if err != nil {
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		var hdr [vnetHdrLen]byte
		iovs := make([][]byte, 0, 4)
		if l.offload {
			if g := pkt.GSOOptions; g.Type != stack.GSONone {
				binary.LittleEndian.PutUint16(hdr[2:], uint16(pkt.HeaderSize()))
				if g.NeedsCsum {
					hdr[0] = vnetFlagNeedsCsum
					binary.LittleEndian.PutUint16(hdr[6:], g.L3HdrLen)
					binary.LittleEndian.PutUint16(hdr[8:], g.CsumOffset)
				}
				if uint16(pkt.Data().Size()) > g.MSS {
					hdr[1] = vnetGSOTCPv4
					if g.Type == stack.GSOTCPv6 {
						hdr[1] = vnetGSOTCPv6
					}
					binary.LittleEndian.PutUint16(hdr[4:], g.MSS)
				}
			}
			iovs = append(iovs, hdr[:])
		}
		size := 0
		for _, v := range pkt.AsSlices() {
			iovs = append(iovs, v)
			size += len(v)
		}
		var werr error
		if err := sc.Write(func(fd uintptr) bool {
			_, werr = unix.Writev(int(fd), iovs)
			return werr != unix.EAGAIN
		}); err != nil || werr != nil {
			l.stats.drop("write_failed")
			continue
		}
		l.stats.out(1, size)
		n++
	}
	return n, nil
}
