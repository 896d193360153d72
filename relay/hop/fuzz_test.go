package hop

import (
	"bytes"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser: it must never panic, and
// whatever it accepts must re-encode to exactly the same bytes, so two relays
// can never disagree about what a header says.
func FuzzParse(f *testing.F) {
	for _, h := range []Header{
		{Kind: KindTCP, Tunnel: "default/iperf", Route: []string{"seattle", "la"}, Target: "127.0.0.1:5201"},
		{Kind: KindUDP, Tunnel: "x/y", Route: []string{"la"}, Target: "[::1]:53"},
		{Kind: KindTrace, Tunnel: "default/to-east", Route: []string{"la", "useast"}},
		{Kind: KindLinks, Tunnel: "default/to-east", Route: []string{"hk", "useast"}},
		{Kind: KindPacket, Tunnel: "default/site", Route: []string{"la"}},
		{Kind: KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.1:0"},
		{Kind: KindTCP, Tunnel: "default/web", Route: []string{"la"}, Target: "10.0.0.1:80", Client: "192.0.2.7:51234", Listener: "[2001:db8::1]:8080"},
	} {
		b, _ := h.Append(nil)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err != nil {
			return
		}
		again, err := h.Append(nil)
		if err != nil {
			t.Fatalf("accepted header does not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
		got, err := Read(bytes.NewReader(b))
		if err != nil || got.Target != h.Target || got.Client != h.Client {
			t.Fatalf("Read disagrees with Parse: %v", err)
		}
	})
}

// FuzzParseDatagram checks the datagram splitter never panics and returns a
// suffix of its input, and that packet counts parse only at their size.
func FuzzParseDatagram(f *testing.F) {
	f.Add(AppendDatagram(nil, 4, []byte("hello")))
	f.Add([]byte{0xc0})
	f.Add(AppendDatagram(nil, CountEchoFlow, AppendCounts(nil, 9, 8)))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, p, err := ParseDatagram(b)
		if err != nil {
			return
		}
		if id == CountFlow || id == CountEchoFlow {
			var sent, received uint64
			if err := ParseCounts(p, &sent, &received); (err == nil) != (len(p) == 16) {
				t.Fatalf("ParseCounts of %d bytes: %v", len(p), err)
			}
		}
		if !bytes.Equal(AppendDatagram(nil, id, p), b) && len(b) > 0 && b[0]>>6 == 0 {
			t.Fatalf("one-byte varint did not round trip: %x", b)
		}
		if len(p) > len(b) {
			t.Fatal("payload longer than datagram")
		}
	})
}

// FuzzReadPacketFrame reads frames from arbitrary bytes: it must never
// panic or read past a frame, and what it accepts must re-encode to the
// bytes it consumed.
func FuzzReadPacketFrame(f *testing.F) {
	f.Add(AppendPacketFrame(nil, make([]byte, VnetHdrLen), []byte{0x45, 0, 0, 20}))
	f.Add([]byte{0, 1, 0, 10})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	buf := make([]byte, MaxPacketFrame)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		hdr, pkt, err := ReadPacketFrame(r, buf)
		if err != nil {
			return
		}
		used := len(b) - r.Len()
		if again := AppendPacketFrame(nil, hdr, pkt); !bytes.Equal(again, b[:used]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b[:used], again)
		}
	})
}

// FuzzReadFrame reads a UDP session's stream frames from arbitrary bytes:
// it must never panic or read past a frame, and what it accepts must
// re-encode to the bytes it consumed.
func FuzzReadFrame(f *testing.F) {
	var w bytes.Buffer
	WriteFrame(&w, nil, []byte("a datagram too large for one"))
	f.Add(w.Bytes())
	f.Add([]byte{0, 0})
	f.Add([]byte{0xff, 0xff, 1})
	buf := make([]byte, MaxFrame)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		p, err := ReadFrame(r, buf)
		if err != nil {
			return
		}
		used := len(b) - r.Len()
		var again bytes.Buffer
		if err := WriteFrame(&again, nil, p); err != nil || !bytes.Equal(again.Bytes(), b[:used]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b[:used], again.Bytes())
		}
	})
}
