package hop

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Kind: KindTCP, Tunnel: "default/iperf", Route: []string{"seattle", "la"}, Target: "127.0.0.1:5201"},
		{Kind: KindUDP, Tunnel: "ns-1/dns", Route: []string{"la"}, Target: "[::1]:53"},
		{Kind: KindTCP, Tunnel: "a/b", Route: make16("r"), Target: "example.internal:443"},
		{Kind: KindTrace, Tunnel: "default/to-east", Route: []string{"la", "useast"}},
		{Kind: KindLinks, Tunnel: "default/to-east", Route: []string{"hk", "la", "useast"}},
		{Kind: KindPacket, Tunnel: "default/site", Route: []string{"mid", "la"}},
		{Kind: KindEcho, Tunnel: "default/subnet", Route: []string{"mid", "la"}, Target: "[fd77:1::1]:0"},
		{Kind: KindTCP, Tunnel: "default/web", Route: []string{"la"}, Target: "10.0.0.1:80", Client: "192.0.2.7:51234", Listener: "198.51.100.1:8080"},
		{Kind: KindUDP, Tunnel: "default/dns", Route: []string{"la"}, Target: "10.0.0.1:53", Client: "[2001:db8::7]:5353", Listener: "[2001:db8::1]:53"},
	} {
		b, err := h.Append([]byte("x"))
		if err != nil {
			t.Fatalf("append %+v: %v", h, err)
		}
		got, err := Parse(b[1:])
		if err != nil {
			t.Fatalf("parse %+v: %v", h, err)
		}
		if got.Kind != h.Kind || got.Tunnel != h.Tunnel || got.Target != h.Target || got.Client != h.Client || got.Listener != h.Listener || strings.Join(got.Route, ",") != strings.Join(h.Route, ",") {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
		// Read must consume exactly the header and leave the flow's bytes.
		r := bytes.NewReader(append(b[1:], "payload"...))
		if _, err := Read(r); err != nil {
			t.Fatalf("read: %v", err)
		}
		if rest := r.Len(); rest != len("payload") {
			t.Fatalf("Read left %d bytes, want %d", rest, len("payload"))
		}
	}
}

func make16(p string) []string {
	out := make([]string, MaxRouteLen)
	for i := range out {
		out[i] = p + string(rune('a'+i))
	}
	return out
}

func TestParseRejects(t *testing.T) {
	good := Header{Kind: KindTCP, Tunnel: "default/t", Route: []string{"la"}, Target: "127.0.0.1:80"}
	enc, _ := good.Append(nil)
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), enc...)) }
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version", mut(func(b []byte) []byte { b[0] = 2; return b }), ErrVersion},
		{"kind", mut(func(b []byte) []byte { b[1] = 9; return b }), ErrKind},
		{"body too long", mut(func(b []byte) []byte { b[2], b[3] = 0xff, 0xff; return b }), ErrTooLong},
		{"truncated body", enc[:len(enc)-1], ErrTruncated},
		{"trailing", append(append([]byte(nil), enc...), 0), ErrTrailing},
		{"zero route", encodeRaw("default/t", nil, "127.0.0.1:80"), ErrField},
		{"17 relays", encodeRaw("default/t", append(make16("r"), "x"), "127.0.0.1:80"), ErrField},
		{"upper-case relay", encodeRaw("default/t", []string{"LA"}, "127.0.0.1:80"), ErrField},
		{"tunnel without namespace", encodeRaw("t", []string{"la"}, "127.0.0.1:80"), ErrField},
		{"target with space", encodeRaw("default/t", []string{"la"}, "1.2.3.4:80 x"), ErrField},
		{"empty target", encodeRaw("default/t", []string{"la"}, ""), ErrField},
		{"route count past body", []byte{1, 1, 0, 4, 0, 1, 'a', 5}, ErrTruncated},
		{"probe with a target", withKind(KindTrace, encodeRaw("default/c", []string{"la"}, "1.2.3.4:80")), ErrField},
		{"links with a target", withKind(KindLinks, encodeRaw("default/c", []string{"la"}, "1.2.3.4:80")), ErrField},
		{"client without a port", withAddrs(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80"), "192.0.2.7", "198.51.100.1:80"), ErrField},
		{"client without listener", withAddrs(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80"), "192.0.2.7:1", ""), ErrField},
		{"client with a zone", withAddrs(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80"), "[fe80::1%eth0]:1", "[fe80::2]:80"), ErrField},
		{"client not canonical", withAddrs(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80"), "192.0.2.07:1", "198.51.100.1:80"), ErrField},
		{"client length past body", append(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80")[:0:0], fixLen(append(encodeRaw("default/t", []string{"la"}, "1.2.3.4:80"), 9, '1'))...), ErrTruncated},
		{"trace with a client", withKind(KindTrace, withAddrs(encodeRaw("default/c", []string{"la"}, ""), "192.0.2.7:1", "198.51.100.1:80")), ErrField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse = %v, want %v", err, tc.want)
			}
			if _, err := Read(bytes.NewReader(tc.in)); err == nil && tc.want != ErrTrailing {
				t.Fatalf("Read accepted %x", tc.in)
			}
		})
	}
}

func TestAppendRefusesWhatParseRejects(t *testing.T) {
	h := Header{Kind: KindTCP, Tunnel: "default/t", Route: []string{"Bad_Name"}, Target: "x:1"}
	if _, err := h.Append(nil); !errors.Is(err, ErrField) {
		t.Fatalf("Append = %v, want ErrField", err)
	}
}

// encodeRaw writes a body without Append's checks, to build hostile input.
func encodeRaw(tunnel string, route []string, target string) []byte {
	body := []byte{byte(len(tunnel) >> 8), byte(len(tunnel))}
	body = append(body, tunnel...)
	body = append(body, byte(len(route)))
	for _, r := range route {
		body = append(body, byte(len(r)))
		body = append(body, r...)
	}
	body = append(body, byte(len(target)>>8), byte(len(target)))
	body = append(body, target...)
	return append([]byte{Version, byte(KindTCP), byte(len(body) >> 8), byte(len(body))}, body...)
}

// withAddrs appends a client and listener to an encoded header.
func withAddrs(b []byte, client, listener string) []byte {
	b = append(b, byte(len(client)))
	b = append(b, client...)
	b = append(b, byte(len(listener)))
	b = append(b, listener...)
	return fixLen(b)
}

// fixLen sets the prefix's body length to what follows it.
func fixLen(b []byte) []byte {
	n := len(b) - PrefixLen
	b[2], b[3] = byte(n>>8), byte(n)
	return b
}

func withKind(k Kind, b []byte) []byte {
	b[1] = byte(k)
	return b
}

func TestDatagram(t *testing.T) {
	for _, id := range []uint64{0, 4, 63, 64, 16383, 16384, 1 << 40} {
		b := AppendDatagram(nil, id, []byte("pkt"))
		got, p, err := ParseDatagram(b)
		if err != nil || got != id || string(p) != "pkt" {
			t.Fatalf("id %d: got %d %q %v", id, got, p, err)
		}
	}
	if _, _, err := ParseDatagram(nil); !errors.Is(err, ErrDatagram) {
		t.Fatalf("empty datagram: %v", err)
	}
	if _, _, err := ParseDatagram([]byte{0x40}); !errors.Is(err, ErrDatagram) {
		t.Fatalf("short varint: %v", err)
	}
}

func TestFrames(t *testing.T) {
	var stream bytes.Buffer
	big := bytes.Repeat([]byte{7}, MaxFrame)
	for _, p := range [][]byte{[]byte("a"), {}, big} {
		if err := WriteFrame(&stream, make([]byte, 0, 2+len(p)), p); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, MaxFrame)
	for _, want := range []int{1, 0, MaxFrame} {
		p, err := ReadFrame(&stream, buf)
		if err != nil || len(p) != want {
			t.Fatalf("frame: len %d err %v, want %d", len(p), err, want)
		}
	}
	stream.Write([]byte{0, 5, 1})
	if _, err := ReadFrame(&stream, buf); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short frame: %v", err)
	}
}

// The datagram ids with a meaning of their own must not be one a UDP
// session can have (the id of a stream the dialing relay opened: a
// multiple of 4), or that session's datagrams would be taken for them.
func TestReservedFlowIDsAreNoSessionIDs(t *testing.T) {
	for name, id := range map[string]uint64{"ProbeFlow": ProbeFlow, "ProbeEchoFlow": ProbeEchoFlow, "DrainFlow": DrainFlow, "DoneFlow": DoneFlow,
		"CountFlow": CountFlow, "CountEchoFlow": CountEchoFlow} {
		if id%4 == 0 {
			t.Errorf("%s = %d is a client-opened bidirectional stream id", name, id)
		}
	}
}

func TestCounts(t *testing.T) {
	var sent, received uint64
	b := AppendCounts(nil, 1<<40+3, 17)
	if err := ParseCounts(b, &sent, &received); err != nil || sent != 1<<40+3 || received != 17 {
		t.Fatalf("ParseCounts = %d, %d, %v; want %d, 17, nil", sent, received, err, uint64(1<<40+3))
	}
	for _, bad := range [][]byte{nil, b[:15], append(b, 0)} {
		if err := ParseCounts(bad, &sent, &received); !errors.Is(err, ErrCounts) {
			t.Errorf("ParseCounts(%d bytes) = %v; want ErrCounts", len(bad), err)
		}
	}
}
