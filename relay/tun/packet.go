package tun

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// VnetHdr is struct virtio_net_hdr, which precedes every packet on a device
// with offload: whether the packet is a super-packet for the kernel to cut
// (GSO), at what size, and where a partial checksum must be completed.
type VnetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
}

// Values of VnetHdr fields.
const (
	VnetHdrLen        = 10
	VnetFlagNeedsCsum = 1
	GSONone           = 0
	GSOTCPv4          = 1
	GSOTCPv6          = 4
	GSOUDPL4          = 5
)

// ParseVnetHdr decodes the header at the start of b.
func ParseVnetHdr(b []byte) (VnetHdr, error) {
	if len(b) < VnetHdrLen {
		return VnetHdr{}, errors.New("tun: short virtio-net header")
	}
	return VnetHdr{
		Flags: b[0], GSOType: b[1],
		HdrLen:     binary.LittleEndian.Uint16(b[2:]),
		GSOSize:    binary.LittleEndian.Uint16(b[4:]),
		CsumStart:  binary.LittleEndian.Uint16(b[6:]),
		CsumOffset: binary.LittleEndian.Uint16(b[8:]),
	}, nil
}

// Encode writes h into b (at least VnetHdrLen bytes).
func (h VnetHdr) Encode(b []byte) []byte {
	b[0], b[1] = h.Flags, h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	return b[:VnetHdrLen]
}

// ErrPacket means a packet that cannot be what its header says.
var ErrPacket = errors.New("tun: malformed packet")

// GSOECN marks a TCP super-packet whose first segment carries CWR.
const GSOECN = 0x80

// minGSOSize is the smallest segment size a peer may ask the kernel to cut
// at: a 64 KiB packet cut at 1 byte is 65,535 segments. Linux's own MSS
// goes no lower than 68 bytes less the TCP header (36 with timestamps,
// against a window that tiny), so no sender of ours needs less.
const minGSOSize = 32

// RebuildVnetHdr returns the virtio-net header the kernel gets for a packet
// from a peer. The kernel trusts the header it is handed (where to write a
// checksum, how to cut, how long the headers are), so a peer's header is
// never passed on: only its requests (cut into segments of GSOSize,
// complete the checksum) are kept, and every offset is worked out from the
// packet. A request the packet cannot satisfy is ErrPacket: a GSO type
// other than TCP for the packet's IP version, a fragment, lengths in the IP
// header that differ from the packet's, a segment size out of bounds.
func RebuildVnetHdr(h VnetHdr, pkt []byte) (VnetHdr, error) {
	gso, ecn := h.GSOType&^GSOECN, h.GSOType&GSOECN
	needsCsum := h.Flags&VnetFlagNeedsCsum != 0
	if gso == GSONone && ecn == 0 && !needsCsum {
		return VnetHdr{}, nil // a plain packet: nothing for the kernel to do
	}
	if gso != GSONone && gso != GSOTCPv4 && gso != GSOTCPv6 || gso == GSONone && ecn != 0 {
		return VnetHdr{}, ErrPacket // the device offers TCP segmentation only
	}
	ip, err := parseIP(pkt)
	if err != nil || !lengthsAgree(ip, pkt) {
		return VnetHdr{}, ErrPacket
	}
	csumOff := 16 // TCP
	switch ip.proto {
	case protoTCP:
		if len(pkt) < ip.ipHdrLen+20 {
			return VnetHdr{}, ErrPacket
		}
	case protoUDP:
		if gso != GSONone || len(pkt) < ip.ipHdrLen+8 {
			return VnetHdr{}, ErrPacket
		}
		csumOff = 6
	default:
		return VnetHdr{}, ErrPacket
	}
	out := VnetHdr{Flags: VnetFlagNeedsCsum, CsumStart: uint16(ip.ipHdrLen), CsumOffset: uint16(csumOff)}
	if gso == GSONone {
		return out, nil
	}
	if ip.v6 != (gso == GSOTCPv6) {
		return VnetHdr{}, ErrPacket
	}
	hdrLen := ip.ipHdrLen + int(pkt[ip.ipHdrLen+12]>>4)*4
	if hdrLen < ip.ipHdrLen+20 || len(pkt) <= hdrLen {
		return VnetHdr{}, ErrPacket // no payload to cut
	}
	if h.GSOSize < minGSOSize || hdrLen+int(h.GSOSize) > 65535 {
		return VnetHdr{}, ErrPacket
	}
	out.GSOType, out.HdrLen, out.GSOSize = h.GSOType, uint16(hdrLen), h.GSOSize
	return out, nil
}

// lengthsAgree says whether an IP packet's header gives its length as the
// packet's own and marks no fragment: the kernel trims a packet to its
// header's length after reading the offsets it was handed.
func lengthsAgree(ip ipInfo, pkt []byte) bool {
	if ip.v6 {
		return int(binary.BigEndian.Uint16(pkt[4:])) == len(pkt)-40
	}
	frag := binary.BigEndian.Uint16(pkt[6:]) & 0x3fff // MF and the offset
	return int(binary.BigEndian.Uint16(pkt[2:])) == len(pkt) && frag == 0
}

// ipInfo is what segmentation needs of an IP packet carrying TCP or UDP.
type ipInfo struct {
	v6       bool
	ipHdrLen int
	proto    uint8
	src, dst netip.Addr
}

func parseIP(pkt []byte) (ipInfo, error) {
	if len(pkt) < 1 {
		return ipInfo{}, ErrPacket
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return ipInfo{}, ErrPacket
		}
		ihl := int(pkt[0]&0xf) * 4
		if ihl < 20 || len(pkt) < ihl {
			return ipInfo{}, ErrPacket
		}
		return ipInfo{ipHdrLen: ihl, proto: pkt[9], src: netip.AddrFrom4([4]byte(pkt[12:16])), dst: netip.AddrFrom4([4]byte(pkt[16:20]))}, nil
	case 6:
		// Extension headers are not walked: the kernel's super-packets
		// carry TCP right after the fixed header.
		if len(pkt) < 40 {
			return ipInfo{}, ErrPacket
		}
		return ipInfo{v6: true, ipHdrLen: 40, proto: pkt[6], src: netip.AddrFrom16([16]byte(pkt[8:24])), dst: netip.AddrFrom16([16]byte(pkt[24:40]))}, nil
	}
	return ipInfo{}, ErrPacket
}

// Addresses returns a packet's source and destination.
func Addresses(pkt []byte) (src, dst netip.Addr, err error) {
	ip, err := parseIP(pkt)
	return ip.src, ip.dst, err
}

const (
	protoTCP = 6
	protoUDP = 17
)

// pseudoSum is the checksum of the pseudo-header over a transport segment
// of length n.
func pseudoSum(ip ipInfo, pkt []byte, n int) uint16 {
	var sum uint16
	if ip.v6 {
		sum = checksum.Checksum(pkt[8:40], 0)
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(n))
		sum = checksum.Checksum(l[:], sum)
	} else {
		sum = checksum.Checksum(pkt[12:20], 0)
		var l [2]byte
		binary.BigEndian.PutUint16(l[:], uint16(n))
		sum = checksum.Checksum(l[:], sum)
	}
	return checksum.Checksum([]byte{0, ip.proto}, sum)
}

// transportChecksum computes the TCP or UDP checksum of a packet in place.
func transportChecksum(ip ipInfo, pkt []byte) error {
	seg := pkt[ip.ipHdrLen:]
	off := 16 // TCP
	if ip.proto == protoUDP {
		off = 6
	} else if ip.proto != protoTCP {
		return ErrPacket
	}
	if len(seg) < off+2 {
		return ErrPacket
	}
	seg[off], seg[off+1] = 0, 0
	sum := ^checksum.Checksum(seg, pseudoSum(ip, pkt, len(seg)))
	if ip.proto == protoUDP && sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(seg[off:], sum)
	return nil
}

func ipv4HeaderChecksum(pkt []byte, ihl int) {
	pkt[10], pkt[11] = 0, 0
	binary.BigEndian.PutUint16(pkt[10:], ^checksum.Checksum(pkt[:ihl], 0))
}

// Complete returns what a packet read with header h becomes as plain IP
// packets, each with complete checksums: a TCP super-packet cut at
// GSOSize, or one packet whose partial checksum is filled in. Packets are
// appended to out, in new buffers.
func Complete(h VnetHdr, pkt []byte, out [][]byte) ([][]byte, error) {
	if h.GSOType == GSONone {
		p := append([]byte(nil), pkt...)
		ip, err := parseIP(p)
		if err != nil {
			return out, err
		}
		if h.Flags&VnetFlagNeedsCsum != 0 {
			if err := transportChecksum(ip, p); err != nil {
				return out, err
			}
		}
		return append(out, p), nil
	}
	if h.GSOType != GSOTCPv4 && h.GSOType != GSOTCPv6 {
		return out, ErrPacket // no UDP segmentation is offered to the kernel
	}
	ip, err := parseIP(pkt)
	if err != nil || ip.proto != protoTCP || ip.v6 != (h.GSOType == GSOTCPv6) {
		return out, ErrPacket
	}
	if len(pkt) < ip.ipHdrLen+20 {
		return out, ErrPacket
	}
	tcpHdrLen := int(pkt[ip.ipHdrLen+12]>>4) * 4
	hdrLen := ip.ipHdrLen + tcpHdrLen
	mss := int(h.GSOSize)
	if tcpHdrLen < 20 || len(pkt) < hdrLen || mss == 0 {
		return out, ErrPacket
	}
	payload := pkt[hdrLen:]
	seq := binary.BigEndian.Uint32(pkt[ip.ipHdrLen+4:])
	var id uint16
	if !ip.v6 {
		id = binary.BigEndian.Uint16(pkt[4:])
	}
	flags := pkt[ip.ipHdrLen+13]
	for i, off := 0, 0; off < len(payload) || off == 0; i, off = i+1, off+mss {
		end := min(off+mss, len(payload))
		seg := make([]byte, hdrLen+end-off)
		copy(seg, pkt[:hdrLen])
		copy(seg[hdrLen:], payload[off:end])
		t := seg[ip.ipHdrLen:]
		binary.BigEndian.PutUint32(t[4:], seq+uint32(off))
		f := flags
		if end < len(payload) {
			f &^= 0x01 | 0x08 // FIN and PSH go with the last segment
		}
		if off > 0 {
			f &^= 0x80 // CWR with the first
		}
		t[13] = f
		if ip.v6 {
			binary.BigEndian.PutUint16(seg[4:], uint16(len(seg)-40))
		} else {
			binary.BigEndian.PutUint16(seg[2:], uint16(len(seg)))
			binary.BigEndian.PutUint16(seg[4:], id+uint16(i))
			ipv4HeaderChecksum(seg, ip.ipHdrLen)
		}
		if err := transportChecksum(ip, seg); err != nil {
			return out, err
		}
		out = append(out, seg)
		if end == len(payload) {
			break
		}
	}
	return out, nil
}

// IsSYN reports whether pkt is a TCP segment with SYN set: the only kind
// ClampMSS changes, so callers can skip working out the MSS for others.
func IsSYN(pkt []byte) bool {
	ip, err := parseIP(pkt)
	return err == nil && ip.proto == protoTCP && len(pkt) >= ip.ipHdrLen+20 && pkt[ip.ipHdrLen+13]&0x02 != 0
}

// ClampMSS lowers the MSS option of a TCP SYN to at most mss and fixes the
// checksum, so that the connection's segments fit where they must go. It
// reports whether it changed the packet; packets that are not SYNs, or
// carry no MSS option, are left alone.
func ClampMSS(pkt []byte, mss uint16) bool {
	ip, err := parseIP(pkt)
	if err != nil || ip.proto != protoTCP || len(pkt) < ip.ipHdrLen+20 {
		return false
	}
	t := pkt[ip.ipHdrLen:]
	if t[13]&0x02 == 0 { // SYN
		return false
	}
	hl := int(t[12]>>4) * 4
	if hl < 20 || len(t) < hl {
		return false
	}
	opts := t[20:hl]
	for i := 0; i < len(opts); {
		switch kind := opts[i]; kind {
		case 0: // end of options
			return false
		case 1: // no-op
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return false
		}
		if opts[i] == 2 && opts[i+1] == 4 {
			if binary.BigEndian.Uint16(opts[i+2:]) <= mss {
				return false
			}
			binary.BigEndian.PutUint16(opts[i+2:], mss)
			transportChecksum(ip, pkt)
			return true
		}
		i += int(opts[i+1])
	}
	return false
}

// IsEchoRequest says whether a packet is an ICMP or ICMPv6 echo request.
func IsEchoRequest(pkt []byte) bool {
	ip, err := parseIP(pkt)
	if err != nil {
		return false
	}
	msg := pkt[ip.ipHdrLen:]
	if len(msg) < 8 || msg[1] != 0 {
		return false
	}
	return !ip.v6 && ip.proto == 1 && msg[0] == 8 || ip.v6 && ip.proto == 58 && msg[0] == 128
}

// HiddenICMP says whether a packet carries ICMP or ICMPv6 that
// IsEchoRequest cannot judge: a fragment of a message (the type is in the
// first fragment alone, the data across all of them), or an ICMPv6 message
// behind IPv6 extension headers. A flow-mode stack handed one would
// reassemble or unwrap a ping and answer it itself, for any address. The
// extension headers are those the stack (gvisor) walks: hop-by-hop,
// routing, destination options, fragment (an atomic one, offset 0 and no
// more, it skips and reads on) and experiment (253, 8 bytes).
func HiddenICMP(pkt []byte) bool {
	ip, err := parseIP(pkt)
	if err != nil {
		return false
	}
	if !ip.v6 {
		return ip.proto == 1 && binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0
	}
	nh, off := ip.proto, 40
	for range 8 { // more extension headers than any sender uses: hidden
		switch nh {
		case 58:
			return off > 40
		case 44: // a fragment: what it is a piece of, by the header's next
			if len(pkt) < off+8 {
				return true
			}
			switch pkt[off] {
			case 58, 0, 43, 44, 60, 253: // ICMPv6, or extension headers that may lead to it
				return true
			}
			return false
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(pkt) < off+2 {
				return true
			}
			nh, off = pkt[off], off+(int(pkt[off+1])+1)*8
		case 253: // experiment: 8 bytes, whatever its length field says
			if len(pkt) < off+8 {
				return true
			}
			nh, off = pkt[off], off+8
		default:
			return false
		}
	}
	return true
}

// ICMPErrorAbout returns the addresses of the packet an ICMP or ICMPv6
// error quotes (destination unreachable, packet too big, time exceeded,
// parameter problem), for a packet that is one: such an error comes from
// a router on the path, whatever its address, and is admitted by the
// packet it is about. The quote must be of the error's own IP version.
func ICMPErrorAbout(pkt []byte) (src, dst netip.Addr, ok bool) {
	ip, err := parseIP(pkt)
	if err != nil {
		return src, dst, false
	}
	msg := pkt[ip.ipHdrLen:]
	if len(msg) < 8 || !ip.v6 && binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0 {
		// A fragment's "error" could quote anything past the first.
		return src, dst, false
	}
	switch {
	case !ip.v6 && ip.proto == 1 && (msg[0] == 3 || msg[0] == 11 || msg[0] == 12):
	case ip.v6 && ip.proto == 58 && msg[0] >= 1 && msg[0] <= 4:
	default:
		return src, dst, false
	}
	inner, err := parseIP(msg[8:])
	if err != nil || inner.v6 != ip.v6 {
		return src, dst, false
	}
	return inner.src, inner.dst, true
}

// Echo is an ICMP or ICMPv6 echo, by the addresses of its request.
type Echo struct {
	Src, Dst netip.Addr
	ID, Seq  uint16
	Data     []byte
}

// ParseEchoRequest returns the ICMP or ICMPv6 echo request a packet
// carries, its data copied; false for any other packet, a fragment, or one
// whose lengths lie. IPv6 extension headers are not walked: a ping's
// request has none.
func ParseEchoRequest(pkt []byte) (Echo, bool) {
	ip, err := parseIP(pkt)
	if err != nil || !IsEchoRequest(pkt) || !lengthsAgree(ip, pkt) {
		return Echo{}, false
	}
	msg := pkt[ip.ipHdrLen:]
	return Echo{
		Src: ip.src, Dst: ip.dst,
		ID:   binary.BigEndian.Uint16(msg[4:]),
		Seq:  binary.BigEndian.Uint16(msg[6:]),
		Data: append([]byte(nil), msg[8:]...),
	}, true
}

// MaxEchoData bounds the data of an echo reply EchoReply builds: what
// fits in one IPv4 packet.
const MaxEchoData = 65535 - 20 - 8

// EchoUnreachable builds the ICMP or ICMPv6 destination unreachable (of
// code) that answers the echo request e, from e.Dst to e.Src, quoting the
// request as the kernel sent it (within 576 bytes for IPv4, 1280 for
// IPv6, as a router quotes). A flow-mode entry writes it when the exit has
// no route to the destination, so ping says so at once.
func EchoUnreachable(e Echo, code uint8) []byte {
	if !e.Src.IsValid() || e.Src.Is4() != e.Dst.Is4() {
		return nil
	}
	// The request, rebuilt as it left: from e.Src to e.Dst.
	req := echoPacket(Echo{Src: e.Dst, Dst: e.Src, ID: e.ID, Seq: e.Seq, Data: e.Data}, true)
	hl, typ, max := 20, byte(3), 576
	if !e.Src.Is4() {
		hl, typ, max = 40, 1, 1280
	}
	if req == nil {
		return nil
	}
	req = req[:min(len(req), max-hl-8)]
	r := make([]byte, hl+8+len(req))
	r[hl], r[hl+1] = typ, code
	copy(r[hl+8:], req)
	return finishICMP(r, e.Dst, e.Src)
}

// EchoReply builds the IP packet that answers the echo request e, from
// e.Dst to e.Src, with e's identifier, sequence number and data; nil if
// the data cannot fit. A tun Tunnel in flow mode writes it into the device
// when the exit heard the destination's own reply.
func EchoReply(e Echo) []byte { return echoPacket(e, false) }

// echoPacket builds an echo reply from e.Dst to e.Src, or with request an
// echo request (the caller swaps the addresses).
func echoPacket(e Echo, request bool) []byte {
	if len(e.Data) > MaxEchoData || !e.Src.IsValid() || e.Src.Is4() != e.Dst.Is4() {
		return nil
	}
	hl, typ := 20, byte(0) // ICMP echo reply
	if request {
		typ = 8
	}
	if !e.Src.Is4() {
		hl, typ = 40, 129 // ICMPv6 echo reply
		if request {
			typ = 128
		}
	}
	r := make([]byte, hl+8+len(e.Data))
	m := r[hl:]
	m[0] = typ
	binary.BigEndian.PutUint16(m[4:], e.ID)
	binary.BigEndian.PutUint16(m[6:], e.Seq)
	copy(m[8:], e.Data)
	return finishICMP(r, e.Dst, e.Src)
}

// finishICMP fills in the IP header of r (an ICMP message after room for
// it) from src to dst, and the message's checksum.
func finishICMP(r []byte, src, dst netip.Addr) []byte {
	if src.Is4() {
		r[0] = 0x45
		binary.BigEndian.PutUint16(r[2:], uint16(len(r)))
		r[8], r[9] = 64, 1
		s, d := src.As4(), dst.As4()
		copy(r[12:], s[:])
		copy(r[16:], d[:])
		ipv4HeaderChecksum(r, 20)
		m := r[20:]
		binary.BigEndian.PutUint16(m[2:], ^checksum.Checksum(m, 0))
		return r
	}
	m := r[40:]
	r[0] = 0x60
	binary.BigEndian.PutUint16(r[4:], uint16(len(m)))
	r[6], r[7] = 58, 64
	s, d := src.As16(), dst.As16()
	copy(r[8:], s[:])
	copy(r[24:], d[:])
	binary.BigEndian.PutUint16(m[2:], ^checksum.Checksum(m, pseudoSum(ipInfo{v6: true, proto: 58}, r, len(m))))
	return r
}

// HeadersLen is the length of a packet's IP header and, where the fixed
// IP header is followed by TCP or UDP, the transport header too: where a
// stack's reads of the headers end. It is 0 for a packet too short to say.
// IPv6 extension headers are not walked (the length then is the fixed
// header's), nor is an IPv4 fragment past the first taken to hold one.
func HeadersLen(pkt []byte) int {
	ip, err := parseIP(pkt)
	if err != nil {
		return 0
	}
	n := ip.ipHdrLen
	if !ip.v6 && binary.BigEndian.Uint16(pkt[6:])&0x1fff != 0 {
		return n
	}
	switch ip.proto {
	case protoTCP:
		if len(pkt) < n+20 {
			return n
		}
		n += int(pkt[n+12]>>4) * 4
	case protoUDP:
		n += 8
	}
	return min(n, len(pkt))
}
