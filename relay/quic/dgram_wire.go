package quic

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// The relays' own datagram channel (dgram.go) sends packets on the QUIC
// socket that are not QUIC: their first byte has QUIC's fixed bit (0x40)
// clear, which no QUIC packet of a version quic-go speaks has, and the
// socket's reader takes them out before quic-go sees them.
//
//	type (1) | receiver's channel id (8) | counter (8) | AEAD(payload) + tag (16)
//
// Each direction of a connection has its own key and id, derived from the
// connection's TLS exporter, so only the two relays the connection
// authenticated can make or read them. The counter is the nonce (after a
// per-direction salt) and feeds a replay window, which also drops the
// second of two copies the sender sent for loss.
const (
	dgTypeData     = 0x10 // a flow's datagram: hop.AppendDatagram's encoding
	dgTypeFeedback = 0x11 // what the receiver got (feedback)
	dgTypeHello    = 0x12 // "I speak the channel": sent until the peer's arrives

	dgHeader   = 1 + 8 + 8
	dgOverhead = dgHeader + 16

	// dgExporterLabel names the keys in the TLS exporter; a new layout
	// takes a new label.
	dgExporterLabel = "EXPORTER-hoplink-datagram-channel-v1"
)

// isChannelPacket says whether a packet read from the socket is the
// channel's and not QUIC's.
func isChannelPacket(b []byte) bool { return len(b) > 0 && b[0]&0x40 == 0 }

var errChannelPacket = errors.New("datagram channel: packet fails authentication")

// dgKeys are one direction's key material.
type dgKeys struct {
	aead cipher.AEAD
	salt [4]byte
	id   uint64 // the receiving end's channel id
}

// dgKeyLen is the exporter bytes one direction takes: a 16-byte AES key,
// the nonce salt and the id.
const dgKeyLen = 16 + 4 + 8

// channelKeys derives both directions from exported keying material;
// client is the direction the QUIC client sends.
func channelKeys(material []byte) (client, server dgKeys, err error) {
	if len(material) != 2*dgKeyLen {
		return client, server, fmt.Errorf("datagram channel: %d bytes of key material, want %d", len(material), 2*dgKeyLen)
	}
	one := func(m []byte) (dgKeys, error) {
		block, err := aes.NewCipher(m[:16])
		if err != nil {
			return dgKeys{}, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return dgKeys{}, err
		}
		k := dgKeys{aead: aead, id: binary.BigEndian.Uint64(m[20:28])}
		copy(k.salt[:], m[16:20])
		return k, nil
	}
	if client, err = one(material[:dgKeyLen]); err != nil {
		return
	}
	server, err = one(material[dgKeyLen:])
	return
}

func (k *dgKeys) nonce(counter uint64) [12]byte {
	var n [12]byte
	copy(n[:4], k.salt[:])
	binary.BigEndian.PutUint64(n[4:], counter)
	return n
}

// seal appends the packet of type typ with counter to dst.
func (k *dgKeys) seal(dst []byte, typ byte, counter uint64, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint64(dst, k.id)
	dst = binary.BigEndian.AppendUint64(dst, counter)
	n := k.nonce(counter)
	return k.aead.Seal(dst, n[:], payload, dst[start:])
}

// channelID reads the receiving end's id of a channel packet, for the
// lookup of its keys; ok is false for a packet too short to be one.
func channelID(b []byte) (id uint64, ok bool) {
	if len(b) < dgOverhead {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[1:9]), true
}

// open authenticates packet b (whose id the caller matched) and returns
// its type, counter and payload, decrypted into a new slice: a flow's sink
// may keep what it is given.
func (k *dgKeys) open(b []byte) (typ byte, counter uint64, payload []byte, err error) {
	if len(b) < dgOverhead {
		return 0, 0, nil, errChannelPacket
	}
	typ, counter = b[0], binary.BigEndian.Uint64(b[9:17])
	n := k.nonce(counter)
	payload, err = k.aead.Open(make([]byte, 0, len(b)-dgOverhead), n[:], b[dgHeader:], b[:dgHeader])
	if err != nil {
		return 0, 0, nil, errChannelPacket
	}
	return typ, counter, payload, nil
}

// replayWindow accepts each counter once, within the last replayBits of
// the highest seen: a replayed packet, and the second copy of a packet
// sent twice, are refused.
type replayWindow struct {
	mu      sync.Mutex
	highest uint64
	seen    bool
	bits    [replayBits / 64]uint64
}

const replayBits = 8192

// accept records counter and reports whether it is new.
func (w *replayWindow) accept(counter uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.seen || counter > w.highest:
		from := uint64(0)
		if w.seen {
			from = w.highest + 1
		}
		// The slots from the old highest on to counter held counters
		// now out of the window.
		if counter-from >= replayBits-1 || !w.seen {
			clear(w.bits[:])
		} else {
			for c := from; c <= counter; c++ {
				w.bits[(c/64)%(replayBits/64)] &^= 1 << (c % 64)
			}
		}
		w.highest, w.seen = counter, true
	case w.highest-counter >= replayBits:
		return false
	}
	word, bit := &w.bits[(counter/64)%(replayBits/64)], uint64(1)<<(counter%64)
	if *word&bit != 0 {
		return false
	}
	*word |= bit
	return true
}
