package quic

import (
	"bytes"
	"crypto/rand"
	"testing"
)

func testKeys(t testing.TB) (client, server dgKeys) {
	m := make([]byte, 2*dgKeyLen)
	rand.Read(m)
	client, server, err := channelKeys(m)
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

// A packet opens with its own direction's keys only, and not once changed.
func TestChannelPacketSealOpen(t *testing.T) {
	client, server := testKeys(t)
	pkt := client.seal(nil, dgTypeData, 42, []byte("datagram"))
	if !isChannelPacket(pkt) {
		t.Fatal("a channel packet reads as QUIC")
	}
	if id, ok := channelID(pkt); !ok || id != client.id {
		t.Fatalf("id %x, want %x", id, client.id)
	}
	typ, counter, p, err := client.open(pkt)
	if err != nil || typ != dgTypeData || counter != 42 || string(p) != "datagram" {
		t.Fatalf("open: %d %d %q %v", typ, counter, p, err)
	}
	if _, _, _, err := server.open(pkt); err == nil {
		t.Error("the other direction's keys opened it")
	}
	for i := range pkt {
		bad := bytes.Clone(pkt)
		bad[i] ^= 1
		if _, _, _, err := client.open(bad); err == nil {
			t.Fatalf("opened with byte %d changed", i)
		}
	}
	if _, _, _, err := client.open(pkt[:dgOverhead-1]); err == nil {
		t.Error("opened a short packet")
	}
	if _, _, err := channelKeys(make([]byte, 10)); err == nil {
		t.Error("keys from 10 bytes of material")
	}
}

// Each counter once, in any order within the window; none from before it.
func TestReplayWindow(t *testing.T) {
	var w replayWindow
	for _, c := range []uint64{1, 3, 2, 5} {
		if !w.accept(c) {
			t.Fatalf("new counter %d refused", c)
		}
	}
	for _, c := range []uint64{1, 2, 3, 5} {
		if w.accept(c) {
			t.Fatalf("counter %d accepted twice", c)
		}
	}
	if !w.accept(4) {
		t.Fatal("a late counter within the window refused")
	}
	if !w.accept(5 + replayBits) {
		t.Fatal("a jump ahead refused")
	}
	if w.accept(5) || w.accept(4) {
		t.Fatal("a counter behind the window accepted")
	}
	if !w.accept(7 + replayBits) {
		t.Fatal("the next counter refused")
	}
	if !w.accept(10 * replayBits) {
		t.Fatal("a long jump refused")
	}
	if w.accept(10*replayBits) || !w.accept(10*replayBits-1) {
		t.Fatal("after a long jump: the bits were not cleared")
	}
}

// Whatever arrives on the socket, the window and the opener hold: no
// panic, and the window accepts a counter once.
func FuzzChannelPacket(f *testing.F) {
	client, _ := testKeys(f)
	f.Add(client.seal(nil, dgTypeData, 1, []byte("x")), uint64(1), uint64(2))
	f.Add([]byte{0x10}, uint64(0), uint64(replayBits))
	f.Fuzz(func(t *testing.T, b []byte, c1, c2 uint64) {
		channelID(b)
		client.open(b)
		parseFeedback(b)
		var w replayWindow
		first := w.accept(c1)
		if !first {
			t.Fatal("the first counter refused")
		}
		if w.accept(c1) {
			t.Fatal("a counter accepted twice")
		}
		second := w.accept(c2)
		if c2 == c1 && second {
			t.Fatal("a counter accepted twice")
		}
		if c2 > c1 && !second {
			t.Fatal("a higher counter refused")
		}
	})
}
