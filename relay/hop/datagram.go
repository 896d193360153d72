package hop

import (
	"encoding/binary"
	"errors"
	"io"

	"github.com/quic-go/quic-go/quicvarint"
)

// A UDP packet crosses a hop as a QUIC datagram: the session's flow id (the
// QUIC stream id of the session's control stream) as a varint, then the
// packet. The flow id is known to both ends of the connection without any
// extra message.

// ErrDatagram means a datagram too short to hold a flow id.
var ErrDatagram = errors.New("hop: malformed datagram")

// AppendDatagram encodes one UDP packet of flow id after b.
func AppendDatagram(b []byte, id uint64, payload []byte) []byte {
	b = quicvarint.Append(b, id)
	return append(b, payload...)
}

// ParseDatagram splits a datagram into flow id and packet.
func ParseDatagram(b []byte) (id uint64, payload []byte, err error) {
	id, n, err := quicvarint.Parse(b)
	if err != nil {
		return 0, nil, ErrDatagram
	}
	return id, b[n:], nil
}

// ErrCounts means a CountFlow or CountEchoFlow payload of the wrong size.
var ErrCounts = errors.New("hop: malformed packet counts")

// AppendCounts encodes packet counts, 8 bytes each, after b.
func AppendCounts(b []byte, counts ...uint64) []byte {
	for _, c := range counts {
		b = binary.BigEndian.AppendUint64(b, c)
	}
	return b
}

// ParseCounts decodes exactly len(into) packet counts from payload.
func ParseCounts(payload []byte, into ...*uint64) error {
	if len(payload) != 8*len(into) {
		return ErrCounts
	}
	for i, p := range into {
		*p = binary.BigEndian.Uint64(payload[8*i:])
	}
	return nil
}

// Packets too large for a datagram ride the session's stream as frames: a
// 16-bit length, then the packet. MaxFrame is the largest UDP payload.
const MaxFrame = 65535

// AppendFrame appends payload framed to buf.
func AppendFrame(buf, payload []byte) []byte {
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(payload)))
	return append(buf, payload...)
}

// WriteFrame writes one UDP packet as a stream frame.
func WriteFrame(w io.Writer, buf []byte, payload []byte) error {
	_, err := w.Write(AppendFrame(buf[:0], payload))
	return err
}

// ReadFrame reads one stream frame into buf (at least MaxFrame bytes) and
// returns the packet.
func ReadFrame(r io.Reader, buf []byte) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return nil, truncated(err)
	}
	return buf[:n], nil
}

// Link probes ride datagrams too, under flow ids that no UDP session can
// have: a session's flow id is the id of a stream the dialing relay opened,
// a multiple of 4. A relay answers every ProbeFlow datagram with a
// ProbeEchoFlow datagram carrying the same payload, and the prober that
// sent it times the round trip.
//
// A relay that drains (shutting down: it takes no new flows, its open
// flows go on) sends DrainFlow, with no payload, on each of its
// connections, and answers probes with it instead of an echo, so a peer
// that missed the first learns within a probe round.
//
// Once its last flow ended it sends DoneFlow, again until the connection
// closes: closing a QUIC connection discards what the peer received but
// has not read yet, so the peer closes it once its own flows on it ended,
// and the draining relay exits when its peers have.
const (
	ProbeFlow     = 1
	ProbeEchoFlow = 2
	DrainFlow     = 3
	// DoneFlow is 6, not 4: stream 4 can carry a session.
	DoneFlow = 6
	// CountFlow carries the packets its sender sent on the connection so
	// far; the other end answers CountEchoFlow with that count and the
	// packets it received (QUIC's counts: a duplicate is not received
	// twice). Their difference is what the link lost, including the lone
	// packets a probe timeout recovered, which a QUIC sender does not
	// count as lost.
	CountFlow     = 5
	CountEchoFlow = 7
	// MaxProbe bounds a probe's payload; larger ones are not answered.
	MaxProbe = 64
)

// A packet-mode tun Tunnel over TLS sends its packets as packet frames: a
// 32-bit length, the packet's 10-byte virtio-net header (which says how
// the kernel may segment it), then the packet, up to a 64 KiB
// super-packet.
const (
	VnetHdrLen     = 10
	MaxPacketFrame = VnetHdrLen + 65535
)

// ErrPacketFrame means a packet frame too short or too long.
var ErrPacketFrame = errors.New("hop: malformed packet frame")

// AppendPacketFrame encodes a packet and its virtio-net header after b.
func AppendPacketFrame(b, vnetHdr, pkt []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(vnetHdr)+len(pkt)))
	return append(append(b, vnetHdr...), pkt...)
}

// ReadPacketFrame reads one packet frame into buf (at least MaxPacketFrame
// bytes) and returns its virtio-net header and packet.
func ReadPacketFrame(r io.Reader, buf []byte) (vnetHdr, pkt []byte, err error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, nil, err
	}
	n := binary.BigEndian.Uint32(l[:])
	if n <= VnetHdrLen || n > MaxPacketFrame {
		return nil, nil, ErrPacketFrame
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return nil, nil, truncated(err)
	}
	return buf[:VnetHdrLen], buf[VnetHdrLen:n], nil
}
