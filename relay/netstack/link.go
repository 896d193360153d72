//go:build linux

package netstack

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"

	"github.com/hoplink/hoplink/relay/tun"
)

// linkEndpointGSOSize is the largest segment the stack builds for the
// kernel to cut.
const linkEndpointGSOSize = 1 << 16

// link is the stack's link endpoint on the device. With offload, it moves
// super-packets both ways: the kernel's 64 KiB TCP segments go to the stack
// whole (TCP takes segments of any size; their checksums are the kernel's
// partial ones, so they count as validated), and the stack's own large
// segments go out with a virtio-net GSO header for the kernel to cut. That
// is where offload is handled, once.
type link struct {
	dev     *tun.Device
	mtu     uint32
	offload bool
	allowed func(netip.Addr) bool
	echo    func(tun.Echo)

	mu         sync.Mutex
	dispatcher stack.NetworkDispatcher
	onClose    func()
	done       chan struct{}
	started    atomic.Bool
	closed     atomic.Bool
}

func newLink(dev *tun.Device, mtu int, allowed func(netip.Addr) bool, echo func(tun.Echo)) *link {
	return &link{dev: dev, mtu: uint32(mtu), offload: dev.Offload, allowed: allowed, echo: echo, done: make(chan struct{})}
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
func (l *link) start() {
	l.started.Store(true)
	go l.read()
}

func (l *link) Wait() {
	if l.started.Load() {
		<-l.done
	}
}

func (l *link) SetOnCloseAction(f func()) {
	l.mu.Lock()
	l.onClose = f
	l.mu.Unlock()
}

// Close is the stack's: by then stopReading has ended the read goroutine.
func (l *link) Close() {
	l.stopReading()
	l.mu.Lock()
	f := l.onClose
	l.onClose = nil
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// stopReading ends the read goroutine and waits for it, outside every lock
// of the stack: a read in progress returns at once (its deadline passes, or
// the device's owner closed it), and a packet being delivered finishes.
func (l *link) stopReading() {
	if !l.closed.Swap(true) {
		l.dev.File().SetReadDeadline(time.Now())
	}
	if l.started.Load() {
		<-l.done
	}
}

// read delivers the device's packets to the stack until the device closes.
// It reads what the device holds in one batch; without offload, the TCP
// segments of a batch that continue one another are joined first (gvisor's
// GRO), so the stack handles one packet per run of segments, not one per
// MTU: per packet, gvisor's IPv6 path costs more than its IPv4 path, and
// the kernel's super-packets do this joining where the device has offload.
func (l *link) read() {
	defer close(l.done)
	stats := l.dev.Stats
	batch := tun.NewBatch()
	var failures tun.ReadFailures
	var gro gro.GRO
	gro.Init(!l.offload)
	for {
		err := l.dev.ReadBatch(batch)
		if failures.Gone(err) || err != nil && l.closed.Load() {
			if !l.closed.Load() {
				stats.Dropped("device_gone")
			}
			return
		}
		if err != nil {
			continue // a packet the kernel failed to hand over
		}
		l.mu.Lock()
		gro.Dispatcher = l.dispatcher
		l.mu.Unlock()
		for i, pkt := range batch.Pkts {
			l.deliver(&gro, batch.Hdrs[i][1], pkt)
		}
		if gro.Dispatcher != nil {
			gro.Flush()
		}
	}
}

// deliver hands one packet read from the device to the stack, through
// GRO, or takes it aside: a ping goes to echo, never to the stack.
func (l *link) deliver(gro *gro.GRO, gso uint8, pkt []byte) {
	stats := l.dev.Stats
	if gso == tun.GSOUDPL4 {
		// The device offers no UDP segmentation (see Stack), so this
		// cannot happen; a UDP super-packet must not reach the stack as
		// one datagram.
		stats.Dropped("unsupported_gso")
		return
	}
	var proto tcpip.NetworkProtocolNumber
	switch pkt[0] >> 4 {
	case 4:
		proto = header.IPv4ProtocolNumber
	case 6:
		proto = header.IPv6ProtocolNumber
	default:
		stats.Dropped("not_ip")
		return
	}
	if tun.HiddenICMP(pkt) {
		// Perhaps a piece of a ping, which the stack would put together
		// and answer itself: dropped, as is a ping too large for the
		// device (see IsEchoRequest below).
		stats.Dropped("hidden_icmp")
		return
	}
	if tun.IsEchoRequest(pkt) {
		// A ping is answered only if its destination answers at the exit:
		// the relay carries it there (echo). Never here, which would say a
		// host is up that may not be.
		e, ok := tun.ParseEchoRequest(pkt)
		switch {
		case !ok:
			stats.Dropped("malformed")
		case !l.allowed(e.Dst):
			stats.Dropped("not_routed")
		case l.echo == nil:
			stats.Dropped("not_routed")
		default:
			l.echo(e)
		}
		return
	}
	if gro.Dispatcher == nil {
		return
	}
	p := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payloadOf(pkt)})
	// Every packet comes from the local kernel (see Capabilities); GRO
	// joins only packets whose checksums are taken as checked.
	p.NetworkProtocolNumber, p.RXChecksumValidated = proto, true
	gro.Enqueue(p)
	p.DecRef()
}

// WritePackets hands the stack's packets to the device, one write each; a
// super-segment carries the GSO header that tells the kernel to cut it.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		var hdr []byte
		if g := pkt.GSOOptions; l.offload && g.Type != stack.GSONone {
			h := tun.VnetHdr{HdrLen: uint16(pkt.HeaderSize())}
			if g.NeedsCsum {
				h.Flags, h.CsumStart, h.CsumOffset = tun.VnetFlagNeedsCsum, g.L3HdrLen, g.CsumOffset
			}
			if uint16(pkt.Data().Size()) > g.MSS {
				h.GSOType, h.GSOSize = tun.GSOTCPv4, g.MSS
				if g.Type == stack.GSOTCPv6 {
					h.GSOType = tun.GSOTCPv6
				}
			}
			var b [tun.VnetHdrLen]byte
			hdr = h.Encode(b[:])
		}
		if l.dev.WritePacket(hdr, pkt.AsSlices()...) == nil {
			n++
		}
	}
	return n, nil
}

// headersApartAbove is the size from which a packet's headers get a chunk
// of their own (payloadOf); a smaller packet's copy costs little.
const headersApartAbove = 1024

// payloadOf is a packet read from the device as the stack's buffer, its
// headers in a small chunk apart from the rest. The stack copies the whole
// chunk that holds a header each time it reads one while the packet's
// chunks are shared, and IPv4's and more so IPv6's handling (which walks
// the payload for extension headers) share every packet: with a single
// chunk, each super-packet of up to 64 KiB was copied again for each header
// read. The payload's chunk, shared or not, is read and never written.
func payloadOf(pkt []byte) buffer.Buffer {
	h := tun.HeadersLen(pkt)
	if len(pkt) < headersApartAbove || h == 0 || h >= len(pkt) {
		return buffer.MakeWithData(pkt)
	}
	b := buffer.MakeWithView(buffer.NewViewWithData(pkt[:h]))
	// Append fills the headers' chunk first (chunks come in powers of
	// two from 64 bytes), then keeps the rest as a view of its own.
	b.Append(buffer.NewViewWithData(pkt[h:]))
	return b
}
