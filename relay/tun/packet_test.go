package tun

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// superPacket builds a TCP super-packet as the kernel hands one over with
// offload: full IP header, a partial (pseudo-header only) TCP checksum.
func superPacket(v6 bool, payload []byte, flags uint8) []byte {
	var ip []byte
	if v6 {
		ip = make([]byte, 40)
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:], uint16(32+len(payload)))
		ip[6], ip[7] = protoTCP, 64
		copy(ip[8:], bytes.Repeat([]byte{0xfd, 1}, 8))
		copy(ip[24:], bytes.Repeat([]byte{0xfd, 2}, 8))
	} else {
		ip = make([]byte, 20)
		ip[0] = 4<<4 | 5
		binary.BigEndian.PutUint16(ip[2:], uint16(20+32+len(payload)))
		binary.BigEndian.PutUint16(ip[4:], 1000)
		ip[6], ip[8], ip[9] = 0x40, 64, protoTCP
		copy(ip[12:], []byte{10, 200, 0, 1})
		copy(ip[16:], []byte{10, 77, 0, 1})
		ipv4HeaderChecksum(ip, 20)
	}
	tcp := make([]byte, 32) // 12 bytes of options, as Linux sends timestamps
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 5201)
	binary.BigEndian.PutUint32(tcp[4:], 0xfffff000) // wraps mid-packet
	tcp[12], tcp[13] = 8<<4, flags
	tcp[20], tcp[21], tcp[22], tcp[23] = 1, 1, 8, 10
	pkt := append(append(ip, tcp...), payload...)
	info, _ := parseIP(pkt)
	binary.BigEndian.PutUint16(pkt[info.ipHdrLen+16:], pseudoSum(info, pkt, len(pkt)-info.ipHdrLen))
	return pkt
}

func TestCompleteCutsSuperPackets(t *testing.T) {
	payload := make([]byte, 5000)
	for i := range payload {
		payload[i] = byte(rand.N(256))
	}
	for _, v6 := range []bool{false, true} {
		h := VnetHdr{Flags: VnetFlagNeedsCsum, GSOType: GSOTCPv4, GSOSize: 1400}
		if v6 {
			h.GSOType = GSOTCPv6
		}
		segs, err := Complete(h, superPacket(v6, payload, 0x18 /* PSH ACK */), nil)
		if err != nil || len(segs) != 4 {
			t.Fatalf("v6=%v: %d segments, %v", v6, len(segs), err)
		}
		var got []byte
		for i, s := range segs {
			info, err := parseIP(s)
			if err != nil {
				t.Fatal(err)
			}
			src, dst := info.src, info.dst
			tcp := header.TCP(s[info.ipHdrLen:])
			n := len(s) - info.ipHdrLen
			if !v6 {
				if !header.IPv4(s).IsChecksumValid() || int(header.IPv4(s).TotalLength()) != len(s) {
					t.Errorf("segment %d: bad IPv4 header", i)
				}
			} else if int(header.IPv6(s).PayloadLength()) != n {
				t.Errorf("segment %d: IPv6 payload length %d, want %d", i, header.IPv6(s).PayloadLength(), n)
			}
			data := s[info.ipHdrLen+int(tcp.DataOffset()):]
			csum := checksum.Checksum(data, 0)
			if !tcp.IsChecksumValid(addr(src), addr(dst), csum, uint16(len(data))) {
				t.Errorf("v6=%v segment %d: TCP checksum invalid", v6, i)
			}
			if want := uint32(0xfffff000) + uint32(len(got)); tcp.SequenceNumber() != want {
				t.Errorf("segment %d: seq %x, want %x", i, tcp.SequenceNumber(), want)
			}
			if psh := tcp.Flags()&header.TCPFlagPsh != 0; psh != (i == len(segs)-1) {
				t.Errorf("segment %d of %d: PSH %v", i, len(segs), psh)
			}
			got = append(got, data...)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("v6=%v: segments do not add up to the payload", v6)
		}
	}
}

func TestCompleteFillsPartialChecksum(t *testing.T) {
	pkt := superPacket(false, []byte("hello"), 0x18)
	out, err := Complete(VnetHdr{Flags: VnetFlagNeedsCsum}, pkt, nil)
	if err != nil || len(out) != 1 {
		t.Fatal(out, err)
	}
	tcp := header.TCP(out[0][20:])
	if !tcp.IsChecksumValid(addr4(10, 200, 0, 1), addr4(10, 77, 0, 1), checksum.Checksum([]byte("hello"), 0), 5) {
		t.Fatal("checksum not completed")
	}
	if _, err := Complete(VnetHdr{GSOType: GSOUDPL4, GSOSize: 1000}, pkt, nil); err == nil {
		t.Fatal("a UDP super-packet was accepted; the device never offers USO")
	}
}

func TestClampMSS(t *testing.T) {
	syn := superPacket(false, nil, 0x02)
	// Replace the options with an MSS of 1460 and two no-ops.
	o := syn[40:52]
	copy(o, []byte{1, 1, 2, 4, 0x05, 0xb4, 1, 1, 1, 1, 1, 1})
	transportChecksum(ipInfo{ipHdrLen: 20, proto: protoTCP}, syn)
	if !IsSYN(syn) {
		t.Fatal("a SYN not seen as one")
	}
	if !ClampMSS(syn, 1200) {
		t.Fatal("MSS 1460 not clamped to 1200")
	}
	if got := binary.BigEndian.Uint16(syn[44:]); got != 1200 {
		t.Fatalf("MSS %d after clamping", got)
	}
	tcp := header.TCP(syn[20:])
	if !tcp.IsChecksumValid(addr4(10, 200, 0, 1), addr4(10, 77, 0, 1), 0, 0) {
		t.Fatal("checksum wrong after clamping")
	}
	if ClampMSS(syn, 1300) {
		t.Fatal("an MSS already below the limit was raised")
	}
	// IPv6: the same option, the checksum over the IPv6 pseudo-header.
	syn6 := superPacket(true, nil, 0x02)
	copy(syn6[60:72], []byte{1, 1, 2, 4, 0x05, 0xa0, 1, 1, 1, 1, 1, 1})
	info6, _ := parseIP(syn6)
	transportChecksum(info6, syn6)
	if !IsSYN(syn6) || !ClampMSS(syn6, 1220) || binary.BigEndian.Uint16(syn6[64:]) != 1220 {
		t.Fatalf("IPv6 MSS 1440 not clamped to 1220: % x", syn6[60:72])
	}
	src6, _ := netip.AddrFromSlice(syn6[8:24])
	dst6, _ := netip.AddrFromSlice(syn6[24:40])
	if !header.TCP(syn6[40:]).IsChecksumValid(addr(src6), addr(dst6), 0, 0) {
		t.Fatal("IPv6 checksum wrong after clamping")
	}
	ack := superPacket(false, nil, 0x10)
	if IsSYN(ack) {
		t.Fatal("an ACK seen as a SYN")
	}
	if ClampMSS(ack, 100) {
		t.Fatal("a segment without SYN was changed")
	}
}

func FuzzComplete(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0x78, 0x05, 0, 0, 0, 0}, superPacket(false, make([]byte, 3000), 0x18))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, superPacket(true, []byte("x"), 0x18))
	f.Fuzz(func(t *testing.T, hdr, pkt []byte) {
		h, err := ParseVnetHdr(hdr)
		if err != nil {
			return
		}
		if h.GSOSize != 0 && h.GSOSize < 8 {
			return // tiny segments of a 64 KiB packet only cost time
		}
		segs, err := Complete(h, pkt, nil)
		if err != nil {
			return
		}
		for _, s := range segs {
			if _, err := parseIP(s); err != nil {
				t.Fatalf("produced a segment that is not IP: %x", s)
			}
		}
	})
}

func FuzzClampMSS(f *testing.F) {
	f.Add(superPacket(false, nil, 0x02), uint16(1200))
	f.Add(superPacket(true, nil, 0x02), uint16(1220))
	f.Fuzz(func(t *testing.T, pkt []byte, mss uint16) {
		ClampMSS(pkt, mss)
	})
}

func addr4(a, b, c, d byte) tcpip.Address { return tcpip.AddrFrom4([4]byte{a, b, c, d}) }

func addr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// A flow-mode entry reads a ping's request, and answers it with the data
// the exit's reply brought, in either family.
func TestEchoRequestAndReply(t *testing.T) {
	// An ICMP echo request 10.200.0.1 -> 10.77.0.1 with 8 bytes of data.
	req := make([]byte, 36)
	req[0], req[2], req[3], req[8], req[9] = 0x45, 0, 36, 64, 1
	copy(req[12:], []byte{10, 200, 0, 1})
	copy(req[16:], []byte{10, 77, 0, 1})
	ipv4HeaderChecksum(req, 20)
	req[20] = 8
	binary.BigEndian.PutUint16(req[24:], 0x1234) // id
	binary.BigEndian.PutUint16(req[26:], 7)      // seq
	copy(req[28:], "hoplink!")
	binary.BigEndian.PutUint16(req[22:], ^checksum.Checksum(req[20:], 0))

	e, ok := ParseEchoRequest(req)
	want := Echo{Src: netip.MustParseAddr("10.200.0.1"), Dst: netip.MustParseAddr("10.77.0.1"), ID: 0x1234, Seq: 7}
	if !ok || e.Src != want.Src || e.Dst != want.Dst || e.ID != want.ID || e.Seq != want.Seq || string(e.Data) != "hoplink!" {
		t.Fatalf("parsed %+v, %v", e, ok)
	}
	r := EchoReply(e)
	if !header.IPv4(r).IsChecksumValid() || header.IPv4(r).SourceAddress() != addr4(10, 77, 0, 1) || header.IPv4(r).DestinationAddress() != addr4(10, 200, 0, 1) {
		t.Fatalf("reply header %x", r[:20])
	}
	m := header.ICMPv4(r[20:])
	if m.Type() != header.ICMPv4EchoReply || m.Ident() != 0x1234 || m.Sequence() != 7 || string(m.Payload()) != "hoplink!" || checksum.Checksum(r[20:], 0) != 0xffff {
		t.Fatalf("reply message %x", r[20:])
	}
	if _, ok := ParseEchoRequest(r); ok {
		t.Fatal("took a reply for a request")
	}
	if _, ok := ParseEchoRequest(superPacket(false, []byte("x"), 0x18)); ok {
		t.Fatal("took a TCP segment for a request")
	}
	frag := bytes.Clone(req)
	frag[6] = 0x20 // more fragments
	if _, ok := ParseEchoRequest(frag); ok {
		t.Fatal("took a fragment for a whole request")
	}

	// ICMPv6: the checksum covers the pseudo-header.
	e6 := Echo{Src: netip.MustParseAddr("fd20::1"), Dst: netip.MustParseAddr("fd77::9"), ID: 3, Seq: 9, Data: []byte("v6")}
	r6 := EchoReply(e6)
	h6 := header.IPv6(r6)
	if h6.SourceAddress() != addr(e6.Dst) || h6.DestinationAddress() != addr(e6.Src) || h6.TransportProtocol() != header.ICMPv6ProtocolNumber || int(h6.PayloadLength()) != len(r6)-40 {
		t.Fatalf("v6 reply header %x", r6[:40])
	}
	m6 := header.ICMPv6(r6[40:])
	sum := header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, h6.SourceAddress(), h6.DestinationAddress(), uint16(len(m6)))
	if m6.Type() != header.ICMPv6EchoReply || m6.Ident() != 3 || m6.Sequence() != 9 || string(m6.Payload()) != "v6" || checksum.Checksum(m6, sum) != 0xffff {
		t.Fatalf("v6 reply message %x", m6)
	}
	// A request built from the reply's addresses parses back.
	q6 := bytes.Clone(r6)
	copy(q6[8:24], r6[24:40])
	copy(q6[24:40], r6[8:24])
	q6[40] = 128
	if e, ok := ParseEchoRequest(q6); !ok || e.Src != e6.Src || e.Dst != e6.Dst || e.Seq != 9 || string(e.Data) != "v6" {
		t.Fatalf("v6 request parsed %+v, %v", e, ok)
	}
	if EchoReply(Echo{Src: e6.Src, Dst: want.Dst}) != nil {
		t.Fatal("a reply across families")
	}
}

// An IPv6 packet too big, from a router behind the exit, names the packet
// it is about.
func TestICMPErrorAbout(t *testing.T) {
	quoted := superPacket(true, []byte("x"), 0x18)[:48]
	pkt := make([]byte, 40, 40+8+len(quoted))
	pkt[0], pkt[6] = 0x60, 58
	copy(pkt[8:], netip.MustParseAddr("fd00::99").AsSlice())
	copy(pkt[24:], quoted[8:24]) // to the quoted packet's source
	pkt = append(pkt, 2, 0, 0, 0, 0, 0, 0x05, 0x00)
	pkt = append(pkt, quoted...)
	binary.BigEndian.PutUint16(pkt[4:], uint16(len(pkt)-40))
	src, dst, ok := ICMPErrorAbout(pkt)
	wantSrc, _ := netip.AddrFromSlice(quoted[8:24])
	wantDst, _ := netip.AddrFromSlice(quoted[24:40])
	if !ok || src != wantSrc || dst != wantDst {
		t.Fatalf("about %v -> %v, %v; want %v -> %v", src, dst, ok, wantSrc, wantDst)
	}
	pkt[40] = 128 // an echo request is no error
	if _, _, ok := ICMPErrorAbout(pkt); ok {
		t.Fatal("an echo request taken for an error")
	}
}

func FuzzICMPErrorAbout(f *testing.F) {
	f.Add(superPacket(false, nil, 0x02))
	// An IPv6 packet too big quoting a TCP segment.
	ptb := make([]byte, 40, 96)
	ptb[0], ptb[6] = 0x60, 58
	ptb = append(append(ptb, 2, 0, 0, 0, 0, 0, 0x05, 0), superPacket(true, []byte("x"), 0x18)...)
	binary.BigEndian.PutUint16(ptb[4:], uint16(len(ptb)-40))
	f.Add(ptb)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		src, dst, ok := ICMPErrorAbout(pkt)
		if ok && (src.Is4() != dst.Is4() || src.Is4() != (pkt[0]>>4 == 4)) {
			t.Fatalf("an error quoting %v -> %v in a packet of version %d", src, dst, pkt[0]>>4)
		}
	})
}

// A destination unreachable for a ping quotes its request as it left, so
// the sender's kernel finds the socket it is for.
func TestEchoUnreachable(t *testing.T) {
	for _, c := range []struct{ src, dst string }{{"10.200.0.1", "10.76.0.1"}, {"fd20::1", "fd76::1"}} {
		e := Echo{Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst), ID: 0x4242, Seq: 3, Data: bytes.Repeat([]byte("x"), 2000)}
		r := EchoUnreachable(e, 1)
		src, dst, err := Addresses(r)
		if err != nil || src != e.Dst || dst != e.Src {
			t.Fatalf("%s: unreachable %v -> %v, %v", c.dst, src, dst, err)
		}
		hl, typ, req, max := 20, byte(3), byte(8), 576
		var sum uint16
		if e.Src.Is6() {
			hl, typ, req, max = 40, 1, 128, 1280
			sum = header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, addr(e.Dst), addr(e.Src), uint16(len(r)-40))
		}
		if r[hl] != typ || r[hl+1] != 1 || len(r) > max || checksum.Checksum(r[hl:], sum) != 0xffff {
			t.Fatalf("%s: message %x (%d bytes)", c.dst, r[hl:hl+8], len(r))
		}
		if qs, qd, ok := ICMPErrorAbout(r); !ok || qs != e.Src || qd != e.Dst {
			t.Fatalf("%s: quotes %v -> %v, %v", c.dst, qs, qd, ok)
		}
		q := r[hl+8:]
		if q[hl] != req || binary.BigEndian.Uint16(q[hl+4:]) != 0x4242 || binary.BigEndian.Uint16(q[hl+6:]) != 3 {
			t.Fatalf("%s: quoted message %x", c.dst, q[hl:hl+8])
		}
	}
}

func FuzzEchoRequest(f *testing.F) {
	f.Add(superPacket(false, nil, 0x02))
	f.Add(EchoReply(Echo{Src: netip.MustParseAddr("fd20::1"), Dst: netip.MustParseAddr("fd77::9"), Data: []byte("x")}))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		e, ok := ParseEchoRequest(pkt)
		if !ok {
			return
		}
		if r := EchoReply(e); len(r) != len(pkt) {
			t.Fatalf("reply of %d bytes to a %d-byte request", len(r), len(pkt))
		}
	})
}

// A peer's virtio-net header never reaches the kernel: what it asks for is
// checked against the packet, and every offset comes from the packet.
func TestRebuildVnetHdr(t *testing.T) {
	v4 := superPacket(false, make([]byte, 3000), 0x18)
	v6 := superPacket(true, make([]byte, 3000), 0x18)
	good := VnetHdr{Flags: VnetFlagNeedsCsum, GSOType: GSOTCPv4, HdrLen: 52, GSOSize: 1400, CsumStart: 20, CsumOffset: 16}
	h, err := RebuildVnetHdr(good, v4)
	if err != nil || h != good {
		t.Fatalf("the kernel's own header for a v4 super-packet: %+v, %v", h, err)
	}
	// Lying offsets are replaced by the packet's.
	lie := VnetHdr{Flags: VnetFlagNeedsCsum | 0x04, GSOType: GSOTCPv6, HdrLen: 65000, GSOSize: 1200, CsumStart: 2, CsumOffset: 0}
	want := VnetHdr{Flags: VnetFlagNeedsCsum, GSOType: GSOTCPv6, HdrLen: 72, GSOSize: 1200, CsumStart: 40, CsumOffset: 16}
	if h, err := RebuildVnetHdr(lie, v6); err != nil || h != want {
		t.Fatalf("v6 with lying offsets: %+v, %v; want %+v", h, err, want)
	}
	if h, err := RebuildVnetHdr(VnetHdr{CsumStart: 9999, HdrLen: 9999}, v4); err != nil || h != (VnetHdr{}) {
		t.Fatalf("a plain packet kept offsets: %+v, %v", h, err)
	}
	if h, err := RebuildVnetHdr(VnetHdr{Flags: VnetFlagNeedsCsum, CsumStart: 0, CsumOffset: 10}, v4); err != nil || h.CsumStart != 20 || h.CsumOffset != 16 {
		t.Fatalf("a partial checksum aimed at the IP header: %+v, %v", h, err)
	}
	udp := append([]byte(nil), v4[:20+8]...)
	udp[9] = protoUDP
	binary.BigEndian.PutUint16(udp[2:], 28)
	if h, err := RebuildVnetHdr(VnetHdr{Flags: VnetFlagNeedsCsum}, udp); err != nil || h.CsumStart != 20 || h.CsumOffset != 6 {
		t.Fatalf("UDP partial checksum: %+v, %v", h, err)
	}
	frag := append([]byte(nil), v4...)
	frag[6] = 0x20 // MF
	short := append([]byte(nil), v4...)
	binary.BigEndian.PutUint16(short[2:], 100)
	bad := map[string]struct {
		h   VnetHdr
		pkt []byte
	}{
		"UDP segmentation of TCP":      {VnetHdr{GSOType: GSOUDPL4, GSOSize: 1400}, v4},
		"UDP GSO type":                 {VnetHdr{GSOType: 3, GSOSize: 1400}, v4},
		"unknown GSO type":             {VnetHdr{GSOType: 0x42, GSOSize: 1400}, v4},
		"TCPv6 on an IPv4 packet":      {VnetHdr{GSOType: GSOTCPv6, GSOSize: 1400}, v4},
		"TCPv4 on an IPv6 packet":      {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1400}, v6},
		"segment size zero":            {VnetHdr{GSOType: GSOTCPv4}, v4},
		"segment size one":             {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1}, v4},
		"segment size past 64 KiB":     {VnetHdr{GSOType: GSOTCPv4, GSOSize: 65500}, v4},
		"ECN without GSO":              {VnetHdr{GSOType: GSOECN}, v4},
		"GSO of a UDP packet":          {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1400}, udp},
		"GSO of a fragment":            {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1400}, frag},
		"IP length shorter":            {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1400}, short},
		"checksum of a fragment":       {VnetHdr{Flags: VnetFlagNeedsCsum}, frag},
		"checksum past the end":        {VnetHdr{Flags: VnetFlagNeedsCsum}, udp[:24]},
		"GSO without payload":          {VnetHdr{GSOType: GSOTCPv4, GSOSize: 1400}, superPacket(false, nil, 0x10)},
		"checksum of neither TCP, UDP": {VnetHdr{Flags: VnetFlagNeedsCsum}, append(append([]byte(nil), udp[:9]...), append([]byte{1}, udp[10:]...)...)},
	}
	for name, c := range bad {
		if h, err := RebuildVnetHdr(c.h, c.pkt); err == nil {
			t.Errorf("%s: accepted as %+v", name, h)
		}
	}
}

func FuzzRebuildVnetHdr(f *testing.F) {
	f.Add([]byte{1, 1, 52, 0, 0x78, 0x05, 20, 0, 16, 0}, superPacket(false, make([]byte, 3000), 0x18))
	f.Add([]byte{1, 4, 0, 0, 0xb0, 0x04, 0, 0, 0, 0}, superPacket(true, make([]byte, 2000), 0x18))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, superPacket(true, []byte("x"), 0x18))
	f.Fuzz(func(t *testing.T, hdr, pkt []byte) {
		in, err := ParseVnetHdr(hdr)
		if err != nil {
			return
		}
		h, err := RebuildVnetHdr(in, pkt)
		if err != nil {
			return
		}
		if again, err := RebuildVnetHdr(h, pkt); err != nil || again != h {
			t.Fatalf("a rebuilt header %+v rebuilds as %+v, %v", h, again, err)
		}
		if h.Flags&^VnetFlagNeedsCsum != 0 {
			t.Fatalf("flags %#x passed on", h.Flags)
		}
		if h.Flags == 0 {
			if h != (VnetHdr{}) {
				t.Fatalf("offsets without a checksum to complete: %+v", h)
			}
			return
		}
		if int(h.CsumStart)+int(h.CsumOffset)+2 > len(pkt) || h.CsumOffset != 6 && h.CsumOffset != 16 {
			t.Fatalf("checksum at %d+%d in a %d-byte packet", h.CsumStart, h.CsumOffset, len(pkt))
		}
		if h.GSOType == GSONone {
			return
		}
		if int(h.HdrLen) >= len(pkt) || h.HdrLen < h.CsumStart+20 || h.GSOSize < minGSOSize {
			t.Fatalf("header length %d, segment size %d in a %d-byte packet", h.HdrLen, h.GSOSize, len(pkt))
		}
		// What the kernel is asked to cut, this package can cut too.
		plain := h
		plain.GSOType &^= GSOECN
		if _, err := Complete(plain, pkt, nil); err != nil {
			t.Fatalf("a rebuilt header %+v that Complete refuses: %v", h, err)
		}
	})
}

// v6Chain builds an IPv6 packet whose headers follow the fixed one: hdrs
// are (next header, its bytes) pairs, last the upper layer's message.
func v6Chain(first uint8, hdrs ...[]byte) []byte {
	p := make([]byte, 40)
	p[0], p[6], p[7] = 0x60, first, 64
	copy(p[8:], netip.MustParseAddr("fd20::1").AsSlice())
	copy(p[24:], netip.MustParseAddr("fd77::9").AsSlice())
	for _, h := range hdrs {
		p = append(p, h...)
	}
	binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
	return p
}

// What a flow-mode stack must not see: pieces of pings, and pings behind
// IPv6 extension headers; TCP and UDP, fragmented or not, pass.
func TestHiddenICMP(t *testing.T) {
	echo6 := []byte{128, 0, 0, 0, 0, 1, 0, 1}
	frag := func(next uint8, offset uint16) []byte { // a fragment header
		h := []byte{next, 0, 0, 0, 0, 0, 0, 42}
		binary.BigEndian.PutUint16(h[2:], offset<<3|1)
		return h
	}
	opts := func(next uint8) []byte { return []byte{next, 0, 1, 4, 0, 0, 0, 0} }    // 8 bytes of padding
	atomic := func(next uint8) []byte { return []byte{next, 0, 0, 0, 0, 0, 0, 43} } // offset 0, no more
	v4 := func(proto uint8, flags uint16) []byte {
		p := make([]byte, 28)
		p[0], p[9] = 0x45, proto
		binary.BigEndian.PutUint16(p[2:], 28)
		binary.BigEndian.PutUint16(p[6:], flags)
		return p
	}
	for _, c := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"IPv6 echo request", v6Chain(58, echo6), false},
		{"IPv6 first fragment of a ping", v6Chain(44, frag(58, 0), echo6), true},
		{"IPv6 later fragment of a ping", v6Chain(44, frag(58, 185), []byte("zzzzzzzz")), true},
		{"IPv6 ping behind destination options", v6Chain(60, opts(58), echo6), true},
		{"IPv6 ping behind hop-by-hop", v6Chain(0, opts(58), echo6), true},
		{"IPv6 fragment behind hop-by-hop", v6Chain(0, opts(44), frag(58, 0), echo6), true},
		{"IPv6 fragment of extension headers", v6Chain(44, frag(60, 0), opts(58), echo6), true},
		{"IPv6 UDP fragment", v6Chain(44, frag(17, 0), make([]byte, 8)), false},
		{"IPv6 TCP behind destination options", v6Chain(60, opts(6), make([]byte, 20)), false},
		{"IPv6 UDP", v6Chain(17, make([]byte, 8)), false},
		{"IPv6 options cut short", v6Chain(60, []byte{58}), true},
		{"IPv6 fragment header cut short", v6Chain(44, []byte{58, 0}), true},
		{"IPv6 endless options", v6Chain(60, bytes.Repeat(opts(60), 9)), true},
		// gvisor skips an atomic fragment header (offset 0, no more) and
		// reads on: one behind another leads to the ping all the same.
		{"IPv6 ping behind two atomic fragment headers", v6Chain(44, atomic(44), atomic(58), echo6), true},
		{"IPv6 first fragment of a fragment of a ping", v6Chain(44, frag(44, 0), atomic(58), echo6), true},
		// gvisor walks the experiment header (253) as an extension header
		// of 8 bytes, whatever its length says.
		{"IPv6 ping behind an experiment header", v6Chain(253, []byte{58, 0, 0, 0, 0, 0, 0, 0}, echo6), true},
		{"IPv6 experiment header cut short", v6Chain(253, []byte{58, 0}), true},
		{"IPv6 fragment of an experiment header", v6Chain(44, frag(253, 0), []byte{58, 0, 0, 0, 0, 0, 0, 0}, echo6), true},
		{"IPv6 UDP behind an experiment header", v6Chain(253, []byte{17, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 8)), false},
		{"IPv4 echo request", v4(1, 0), false},
		{"IPv4 first fragment of a ping", v4(1, 0x2000), true},
		{"IPv4 later fragment of a ping", v4(1, 185), true},
		{"IPv4 don't fragment", v4(1, 0x4000), false},
		{"IPv4 UDP fragment", v4(17, 0x2000), false},
		{"not IP", []byte{0x10, 0}, false},
	} {
		if got := HiddenICMP(c.pkt); got != c.want {
			t.Errorf("%s: HiddenICMP = %v, want %v", c.name, got, c.want)
		}
	}
}

func FuzzHiddenICMP(f *testing.F) {
	f.Add(v6Chain(44, []byte{58, 0, 0, 1, 0, 0, 0, 42}, []byte{128, 0, 0, 0, 0, 1, 0, 1}))
	f.Add(v6Chain(60, []byte{58, 0, 1, 4, 0, 0, 0, 0}, []byte{128, 0, 0, 0, 0, 1, 0, 1}))
	f.Add(superPacket(false, nil, 0x02))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		// A plain echo request is never hidden: the stack's Echo takes it.
		if _, ok := ParseEchoRequest(pkt); ok && HiddenICMP(pkt) {
			t.Fatalf("a whole echo request taken for a hidden one: % x", pkt)
		}
	})
}

func TestHeadersLen(t *testing.T) {
	v4 := func(proto uint8, fragOff uint16, tail ...byte) []byte {
		p := make([]byte, 20)
		p[0], p[9] = 0x45, proto
		binary.BigEndian.PutUint16(p[6:], fragOff)
		return append(p, tail...)
	}
	udp8 := make([]byte, 8+100)
	for _, c := range []struct {
		name string
		pkt  []byte
		want int
	}{
		{"IPv4 TCP with options", superPacket(false, make([]byte, 2000), 0x10), 20 + 32},
		{"IPv6 TCP with options", superPacket(true, make([]byte, 2000), 0x10), 40 + 32},
		{"IPv6 TCP, header only", superPacket(true, nil, 0x02), 40 + 32},
		{"IPv4 UDP", v4(17, 0, udp8...), 28},
		{"IPv4 fragment past the first", v4(6, 0x2001, make([]byte, 200)...), 20},
		{"IPv4 TCP cut short", v4(6, 0, 0, 1, 2), 20},
		{"IPv4 ICMP", v4(1, 0, 8, 0, 0, 0), 20},
		{"IPv6 behind an extension header", v6Chain(60, []byte{6, 0, 1, 4, 0, 0, 0, 0}, make([]byte, 40)), 40},
		{"UDP header longer than the packet", v4(17, 0, 1, 2), 22},
		{"empty", nil, 0},
		{"not IP", []byte{0x10, 0}, 0},
	} {
		if got := HeadersLen(c.pkt); got != c.want {
			t.Errorf("%s: HeadersLen = %d, want %d", c.name, got, c.want)
		}
	}
}

func FuzzHeadersLen(f *testing.F) {
	f.Add(superPacket(false, nil, 0x02))
	f.Add(superPacket(true, make([]byte, 10), 0x10))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if n := HeadersLen(pkt); n < 0 || n > len(pkt) {
			t.Fatalf("HeadersLen = %d of a %d-byte packet", n, len(pkt))
		}
	})
}
