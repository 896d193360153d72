//go:build linux

package netstack

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// A large packet's headers sit in a chunk of their own, so that the
// stack's reads of them while the packet is shared (it clones the chunk a
// header lies in) copy that small chunk, not the whole packet; the bytes
// are the packet's either way.
func TestPayloadKeepsHeadersApart(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		pkt, hdrs := tcpPacket(v6, 60000)
		b := payloadOf(pkt)
		if got := b.Flatten(); !bytes.Equal(got, pkt) {
			t.Fatalf("v6=%v: the buffer holds other bytes than the packet", v6)
		}
		shared := b.Clone() // as IPv6's extension-header walk does
		v, ok := b.PullUp(0, hdrs)
		if !ok {
			t.Fatalf("v6=%v: headers not pulled up", v6)
		}
		if c := v.Capacity(); c >= headersApartAbove {
			t.Errorf("v6=%v: reading the %d bytes of headers of a shared packet copied a chunk of %d bytes", v6, hdrs, c)
		}
		if !bytes.Equal(v.AsSlice(), pkt[:hdrs]) {
			t.Errorf("v6=%v: headers pulled up differ", v6)
		}
		shared.Release()
		b.Release()
	}
	small, _ := tcpPacket(false, 100)
	if b := payloadOf(small); !bytes.Equal(b.Flatten(), small) {
		t.Error("a small packet's buffer holds other bytes")
	}
}

// tcpPacket is an IP packet carrying a TCP segment of n bytes, and the
// length of its headers.
func tcpPacket(v6 bool, n int) ([]byte, int) {
	var ip []byte
	if v6 {
		ip = make([]byte, 40)
		ip[0], ip[6] = 6<<4, 6
		binary.BigEndian.PutUint16(ip[4:], uint16(20+n))
	} else {
		ip = make([]byte, 20)
		ip[0], ip[9] = 0x45, 6
		binary.BigEndian.PutUint16(ip[2:], uint16(40+n))
	}
	tcp := make([]byte, 20)
	tcp[12] = 5 << 4
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	return append(append(ip, tcp...), payload...), len(ip) + 20
}
