package admit

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/hoplink/hoplink/relay/tun"
)

// ipv4 makes a minimal IPv4 header from src to dst.
func ipv4(src, dst string) []byte {
	p := make([]byte, 28)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[9] = 17
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	return p
}

// ping makes an ICMP echo request from src to dst.
func ping(src, dst string) []byte {
	p := ipv4(src, dst)
	p[9] = 1
	p[20] = 8
	return p
}

// icmpError makes an ICMP error of type typ from src to dst, quoting the
// header of a packet from qsrc to qdst.
func icmpError(typ byte, src, dst, qsrc, qdst string) []byte {
	p := ipv4(src, dst)[:20]
	p[9] = 1
	p = append(p, typ, 0, 0, 0, 0, 0, 0, 0)
	p = append(p, ipv4(qsrc, qdst)...)
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	return p
}

// fragment marks p as the first fragment of a larger packet.
func fragment(p []byte) []byte {
	p = append([]byte(nil), p...)
	p[6] |= 0x20 // more fragments
	return p
}

func tunICMPError(p []byte) (netip.Addr, bool) {
	_, dst, ok := tun.ICMPErrorAbout(p)
	return dst, ok
}

func TestPackets(t *testing.T) {
	set := fixture(t)
	rules, err := NewPackets(set.Tunnel("default/site"))
	if err != nil {
		t.Fatal(err)
	}
	if got := rules.ExitAddress().String(); got != "10.201.0.2/24" {
		t.Fatalf("exit address %s, want the entry's + 1", got)
	}
	if len(rules.SourceRoutes()) != 0 {
		t.Fatalf("default sources are routed already: %v", rules.SourceRoutes())
	}
	into := []struct {
		pkt    []byte
		reason string
	}{
		{ipv4("10.201.0.1", "10.77.2.9"), ""},
		{ipv4("10.201.0.1", "10.201.0.2"), ""},
		{ipv4("10.201.0.1", "10.50.0.2"), NotRouted},
		{[]byte{0x60, 0}, NotIP},
		{nil, NotIP},
	}
	for _, c := range into {
		if got := rules.IntoSession(c.pkt); got != c.reason {
			t.Errorf("IntoSession(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
	exit := []struct {
		pkt    []byte
		reason string
	}{
		{ipv4("10.201.0.1", "10.77.2.9"), ""},
		{ipv4("10.201.0.7", "10.77.2.9"), ""},
		{ping("10.201.0.1", "10.201.0.2"), ""},
		{ipv4("10.201.0.1", "10.201.0.2"), NotRouted}, // the exit host's own services
		{ipv4("10.201.0.1", "10.201.0.3"), NotRouted},
		{ipv4("10.50.0.2", "10.77.2.9"), NotSource},
		{ipv4("10.201.0.1", "10.50.0.2"), NotRouted},
		{[]byte{0x45}, NotIP},
		// A router on the entry side: unreachable, about a routed host's reply.
		{icmpError(3, "10.50.0.1", "10.77.2.9", "10.77.2.9", "10.201.0.7"), ""},
		{icmpError(3, "10.50.0.1", "10.77.2.9", "10.77.2.9", "10.50.0.3"), NotSource},
		{icmpError(3, "10.50.0.1", "10.77.2.9", "10.77.2.8", "10.201.0.7"), NotSource},
		{icmpError(0, "10.50.0.1", "10.77.2.9", "10.77.2.9", "10.201.0.7"), NotSource}, // an echo reply
		{fragment(icmpError(3, "10.50.0.1", "10.77.2.9", "10.77.2.9", "10.201.0.7")), NotSource},
	}
	for _, c := range exit {
		src, got := rules.IntoExit(c.pkt)
		if got != c.reason {
			t.Errorf("IntoExit(% x) = %q, want %q", c.pkt, got, c.reason)
		}
		// A router's error names no source to learn replies' way by: its
		// address is no client's.
		if _, isErr := tunICMPError(c.pkt); got == "" && isErr == src.IsValid() {
			t.Errorf("IntoExit(% x): source %v for an ICMP error %v", c.pkt, src, isErr)
		}
	}
	back := []struct {
		pkt    []byte
		reason string
	}{
		{ipv4("10.77.2.9", "10.201.0.1"), ""},
		{ipv4("10.201.0.2", "10.201.0.1"), ""}, // the exit answering a ping
		{ipv4("10.201.0.1", "10.201.0.1"), NotRouted},
		{ipv4("10.77.2.9", "10.50.0.2"), NotSource}, // a host behind the entry
		{ipv4("10.50.0.9", "10.201.0.1"), NotRouted},
		{nil, NotIP},
		// A router behind the exit: unreachable, too big, time exceeded.
		{icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9"), ""},
		{icmpError(11, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9"), ""},
		{icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.50.0.2"), NotRouted},
		{icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.5", "10.77.2.9"), NotRouted},
		{icmpError(8, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9"), NotRouted},      // a request
		{icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9")[:40], NotRouted}, // quote cut short
	}
	for _, c := range back {
		if got := rules.IntoEntry(c.pkt); got != c.reason {
			t.Errorf("IntoEntry(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
	if _, err := NewPackets(set.Tunnel("default/web")); err == nil {
		t.Error("rules for a Tunnel without spec.tun")
	}
}
