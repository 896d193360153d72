package admit

import (
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/hoplink/hoplink/manifest"
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

// ipv6 makes a minimal IPv6 header (and 8 bytes of UDP) from src to dst.
func ipv6(src, dst string) []byte {
	p := make([]byte, 48)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], 8)
	p[6], p[7] = 17, 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	return p
}

// icmp6 makes an ICMPv6 message of type typ from src to dst, quoting a
// packet from qsrc to qdst when they are given.
func icmp6(typ byte, src, dst, qsrc, qdst string) []byte {
	p := ipv6(src, dst)[:40]
	p[6] = 58
	p = append(p, typ, 0, 0, 0, 0, 0, 0x05, 0x00) // a packet too big's MTU: 1280
	if qsrc != "" {
		p = append(p, ipv6(qsrc, qdst)...)
	}
	binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
	return p
}

// dualPackets are the rules of a packet-mode Tunnel whose device carries
// both families: an IPv4 address, routes of each family, and the entry
// host's own IPv6 network among its sources beside the device's prefix.
func dualPackets(t testing.TB) *Packets {
	t.Helper()
	set := fixture(t)
	tn := set.Tunnel("default/site").DeepCopy()
	tn.Spec.TUN.Routes = []string{"10.77.2.0/24", "fd77:2::/64"}
	tn.Spec.TUN.Sources = []string{"10.201.0.0/24", "fd30::/64"}
	rules, err := NewPackets(tn)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func TestPacketsIPv6(t *testing.T) {
	set := fixture(t)
	six := set.Tunnel("default/site").DeepCopy()
	six.Spec.TUN.Address, six.Spec.TUN.Routes = "fd20:1::1/64", []string{"fd77:2::/64"}
	rules, err := NewPackets(six)
	if err != nil {
		t.Fatal(err)
	}
	if got := rules.ExitAddress().String(); got != "fd20:1::2/64" {
		t.Fatalf("exit address %s, want the entry's + 1", got)
	}
	if len(rules.SourceRoutes()) != 0 {
		t.Fatalf("default sources are routed already: %v", rules.SourceRoutes())
	}
	for _, c := range []struct {
		pkt    []byte
		reason string
	}{
		{ipv6("fd20:1::1", "fd77:2::9"), ""},
		{ipv6("fd20:1::1", "fd20:1::2"), ""},
		{ipv6("fd20:1::1", "fd77:3::9"), NotRouted},
		{ipv6("fd20:1::1", "::ffff:10.77.2.9"), NotRouted}, // mapped: not the v4 route
	} {
		if got := rules.IntoSession(c.pkt); got != c.reason {
			t.Errorf("IntoSession(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
	for _, c := range []struct {
		pkt    []byte
		reason string
	}{
		{ipv6("fd20:1::1", "fd77:2::9"), ""},
		{ipv6("fd20:1::7", "fd77:2::9"), ""},
		{icmp6(128, "fd20:1::1", "fd20:1::2", "", ""), ""},               // a ping of the exit
		{ipv6("fd20:1::1", "fd20:1::2"), NotRouted},                      // its services
		{icmp6(129, "fd20:1::1", "fd20:1::2", "", ""), NotRouted},        // a reply is no ping
		{ipv6("fd30::1", "fd77:2::9"), NotSource},                        // not a source
		{ipv6("fe80::1", "fd77:2::9"), NotSource},                        // nor a link-local
		{icmp6(1, "fd50::1", "fd77:2::9", "fd77:2::9", "fd20:1::7"), ""}, // unreachable, about a reply
		{icmp6(1, "fd50::1", "fd77:2::9", "fd77:2::9", "fd30::7"), NotSource},
	} {
		if _, got := rules.IntoExit(c.pkt); got != c.reason {
			t.Errorf("IntoExit(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
	for _, c := range []struct {
		pkt    []byte
		reason string
	}{
		{ipv6("fd77:2::9", "fd20:1::1"), ""},
		{icmp6(129, "fd20:1::2", "fd20:1::1", "", ""), ""}, // the exit answering a ping
		// A router behind the exit: packet too big for path MTU discovery,
		// unreachable, time exceeded, parameter problem.
		{icmp6(2, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9"), ""},
		{icmp6(1, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9"), ""},
		{icmp6(3, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9"), ""},
		{icmp6(4, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9"), ""},
		{icmp6(2, "fd50::9", "fd20:1::1", "fd20:1::1", "fd50::2"), NotRouted},   // about no routed host
		{icmp6(2, "fd50::9", "fd20:1::1", "fd20:1::5", "fd77:2::9"), NotRouted}, // about another's packet
		{icmp6(128, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9"), NotRouted},
		{icmp6(2, "fd50::9", "fd20:1::1", "fd20:1::1", "fd77:2::9")[:60], NotRouted}, // quote cut short
		{ipv6("fd77:2::9", "fd30::2"), NotSource},
		{ipv6("fd50::9", "fd20:1::1"), NotRouted},
	} {
		if got := rules.IntoEntry(c.pkt); got != c.reason {
			t.Errorf("IntoEntry(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
}

// Both families through one device: each packet is judged by the prefixes
// of its own family, and an error must quote a packet of its own.
func TestPacketsDualStack(t *testing.T) {
	rules := dualPackets(t)
	if got := rules.SourceRoutes(); len(got) != 1 || got[0].String() != "fd30::/64" {
		t.Fatalf("source routes %v; want fd30::/64 alone (the kernel routes the device's prefix)", got)
	}
	for _, c := range []struct {
		pkt           []byte
		session, exit string
	}{
		{ipv4("10.201.0.1", "10.77.2.9"), "", ""},
		{ipv6("fd30::1", "fd77:2::9"), "", ""},
		{ipv6("fd30::1", "fd77:3::9"), NotRouted, NotRouted},
		{ipv6("fd31::1", "fd77:2::9"), "", NotSource},
		{ipv4("10.201.0.1", "10.77.3.9"), NotRouted, NotRouted},
	} {
		if got := rules.IntoSession(c.pkt); got != c.session {
			t.Errorf("IntoSession(% x) = %q, want %q", c.pkt, got, c.session)
		}
		if _, got := rules.IntoExit(c.pkt); got != c.exit {
			t.Errorf("IntoExit(% x) = %q, want %q", c.pkt, got, c.exit)
		}
	}
	for _, c := range []struct {
		pkt    []byte
		reason string
	}{
		{ipv4("10.77.2.9", "10.201.0.1"), ""},
		{ipv6("fd77:2::9", "fd30::1"), ""},
		{icmp6(2, "fd50::9", "fd30::1", "fd30::1", "fd77:2::9"), ""},
		{icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9"), ""},
		{ipv6("fd77:2::9", "fd31::1"), NotSource},
		// An ICMPv6 error quoting an IPv4 packet quotes nothing it sent.
		{append(icmp6(2, "fd50::9", "fd30::1", "", ""), ipv4("10.201.0.1", "10.77.2.9")...), NotRouted},
	} {
		if got := rules.IntoEntry(c.pkt); got != c.reason {
			t.Errorf("IntoEntry(% x) = %q, want %q", c.pkt, got, c.reason)
		}
	}
}

// Whatever a packet holds, what the rules admit keeps to the Tunnel's
// prefixes: into the session, to a route or the device's prefix; into the
// exit, from a source (or an error about a source's packet); into the
// entry, to a source.
func FuzzPackets(f *testing.F) {
	f.Add(ipv4("10.201.0.1", "10.77.2.9"))
	f.Add(ipv6("fd30::1", "fd77:2::9"))
	f.Add(icmp6(2, "fd50::9", "fd30::1", "fd30::1", "fd77:2::9"))
	f.Add(icmpError(3, "10.50.0.9", "10.201.0.1", "10.201.0.1", "10.77.2.9"))
	f.Add(icmp6(128, "fd30::1", "10.201.0.2", "", ""))
	rules := dualPackets(f)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		src, dst, err := tun.Addresses(pkt)
		if rules.IntoSession(pkt) == "" && (err != nil || !rules.EntryAddress().Masked().Contains(dst) && !holds(rules.Routes(), dst)) {
			t.Fatalf("into the session: %v -> %v, %v", src, dst, err)
		}
		if learnt, reason := rules.IntoExit(pkt); reason == "" {
			if learnt.IsValid() && (learnt != src || !holds(rules.Sources(), src)) {
				t.Fatalf("into the exit: learnt %v from %v -> %v", learnt, src, dst)
			}
			if !learnt.IsValid() {
				if qsrc, _, ok := tun.ICMPErrorAbout(pkt); !ok || !holds(rules.Sources(), qsrc) {
					t.Fatalf("into the exit without a source: %v -> %v", src, dst)
				}
			}
		}
		if rules.IntoEntry(pkt) == "" && (err != nil || !holds(rules.Sources(), dst)) {
			t.Fatalf("into the entry: %v -> %v, %v", src, dst, err)
		}
	})
}

// Whatever a packet-mode spec.tun holds, one that loads gives rules a relay
// can open both devices with: the exit's address another in the entry's
// prefix, no source routed twice, prefixes as written and of a real family.
func FuzzTunSpec(f *testing.F) {
	f.Add("10.201.0.1/24", "10.77.2.0/24", "", "")
	f.Add("fd20::1/64", "fd77::/64", "fd20::9/64", "fd20::/64")
	f.Add("10.201.0.1/24", "fd77::/64", "", "fd30::/64")
	f.Add("fd20::ffff:ffff:ffff:ffff/64", "fd77::/64", "", "")
	f.Add("::ffff:10.201.0.1/120", "::ffff:10.77.0.0/112", "", "")
	const head = `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: site}
spec: {chain: c, protocol: tun, tun: `
	f.Fuzz(func(t *testing.T, addr, route, exit, source string) {
		u := map[string]any{"name": "hl0", "address": addr, "routes": []string{route}, "mode": "packet"}
		if exit != "" {
			u["exitAddress"] = exit
		}
		if source != "" {
			u["sources"] = []string{source}
		}
		j, _ := json.Marshal(u) // JSON is YAML
		set, err := manifest.Parse("fuzz.yaml", []byte(head+string(j)+"}\n"))
		if err != nil {
			return
		}
		rules, err := NewPackets(set.Tunnel("default/site"))
		if err != nil {
			t.Fatalf("%s loads, but its rules do not: %v", j, err)
		}
		entry, exitP := rules.EntryAddress(), rules.ExitAddress()
		if entry.Masked() != exitP.Masked() || entry.Addr() == exitP.Addr() {
			t.Fatalf("%s: entry %v, exit %v", j, entry, exitP)
		}
		for _, p := range append(slices.Clone(rules.Routes()), rules.SourceRoutes()...) {
			if p != p.Masked() || p.Addr().Is4In6() {
				t.Fatalf("%s: prefix %v", j, p)
			}
			if p == exitP.Masked() && slices.Contains(rules.SourceRoutes(), p) {
				t.Fatalf("%s: the device's prefix %v routed again", j, p)
			}
		}
		if entry.Addr().Is4In6() {
			t.Fatalf("%s: address %v", j, entry)
		}
	})
}
