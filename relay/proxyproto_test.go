package relay

import (
	"bufio"
	"bytes"
	"net"
	"net/netip"
	"testing"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

func proxyTunnel(version v1alpha1.ProxyProtocol) *v1alpha1.Tunnel {
	return &v1alpha1.Tunnel{Spec: v1alpha1.TunnelSpec{ProxyProtocol: version}}
}

// The addresses the entry puts in the hop header: IPv6 as IPv6, bracketed;
// an IPv4 client of a dual-stack listener ([::]) as the IPv4 it is, so the
// exit writes TCP4 rather than TCP6 with a mapped address.
func TestProxyAddrsBothFamilies(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	udp := func(s string) net.Addr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		client, listener net.Addr
		c, l             string
	}{
		{tcp("192.0.2.7:4242"), tcp("10.0.0.1:443"), "192.0.2.7:4242", "10.0.0.1:443"},
		{tcp("[2001:db8::7]:4242"), tcp("[2001:db8::1]:443"), "[2001:db8::7]:4242", "[2001:db8::1]:443"},
		{tcp("[::ffff:192.0.2.7]:4242"), tcp("[::ffff:10.0.0.1]:443"), "192.0.2.7:4242", "10.0.0.1:443"},
		{udp("[2001:db8::7]:5353"), udp("[2001:db8::1]:53"), "[2001:db8::7]:5353", "[2001:db8::1]:53"},
		{tcp("[fe80::7%eth0]:4242"), tcp("[fe80::1%eth0]:443"), "[fe80::7%eth0]:4242", "[fe80::1%eth0]:443"},
		{&net.UnixAddr{Name: "/x"}, tcp("10.0.0.1:443"), "", ""},
	} {
		c, l := proxyAddrs(proxyTunnel(v1alpha1.ProxyV2), tc.client, tc.listener)
		if c != tc.c || l != tc.l {
			t.Errorf("proxyAddrs(%v, %v) = %q, %q; want %q, %q", tc.client, tc.listener, c, l, tc.c, tc.l)
		}
	}
	if c, l := proxyAddrs(proxyTunnel(""), tcp("[2001:db8::7]:1"), tcp("[2001:db8::1]:2")); c != "" || l != "" {
		t.Errorf("a Tunnel without proxyProtocol carries addresses: %q %q", c, l)
	}
}

// The header the exit writes, read back as a target would read it: v1's
// TCP6 line and v2's AF_INET6 address block carry IPv6 clients; IPv4 ones
// keep TCP4 and AF_INET; addresses that did not come (an older entry) say
// UNKNOWN or LOCAL.
func TestProxyHeaderBothFamilies(t *testing.T) {
	for _, tc := range []struct {
		name             string
		version          v1alpha1.ProxyProtocol
		udp              bool
		client, listener string
		proto            proxyproto.AddressFamilyAndProtocol
		exact            string // v1: the whole line
		famByte          byte   // v2: the 14th byte, family and protocol
	}{
		{"v1 tcp4", v1alpha1.ProxyV1, false, "192.0.2.7:4242", "10.0.0.1:443", proxyproto.TCPv4, "PROXY TCP4 192.0.2.7 10.0.0.1 4242 443\r\n", 0},
		{"v1 tcp6", v1alpha1.ProxyV1, false, "[2001:db8::7]:4242", "[2001:db8::1]:443", proxyproto.TCPv6, "PROXY TCP6 2001:db8::7 2001:db8::1 4242 443\r\n", 0},
		{"v1 tcp6 zone dropped", v1alpha1.ProxyV1, false, "[fe80::7%eth0]:4242", "[fe80::1%eth0]:443", proxyproto.TCPv6, "PROXY TCP6 fe80::7 fe80::1 4242 443\r\n", 0},
		{"v1 unknown", v1alpha1.ProxyV1, false, "", "", proxyproto.UNSPEC, "PROXY UNKNOWN\r\n", 0},
		{"v2 tcp4", v1alpha1.ProxyV2, false, "192.0.2.7:4242", "10.0.0.1:443", proxyproto.TCPv4, "", 0x11},
		{"v2 tcp6", v1alpha1.ProxyV2, false, "[2001:db8::7]:4242", "[2001:db8::1]:443", proxyproto.TCPv6, "", 0x21},
		{"v2 udp6", v1alpha1.ProxyV2, true, "[2001:db8::7]:5353", "[2001:db8::1]:53", proxyproto.UDPv6, "", 0x22},
		{"v2 udp4", v1alpha1.ProxyV2, true, "192.0.2.7:5353", "10.0.0.1:53", proxyproto.UDPv4, "", 0x12},
		{"v2 local", v1alpha1.ProxyV2, false, "", "", proxyproto.UNSPEC, "", 0x00},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := proxyHeader(proxyTunnel(tc.version), tc.udp, tc.client, tc.listener)
			if tc.exact != "" && string(b) != tc.exact {
				t.Errorf("header %q, want %q", b, tc.exact)
			}
			if tc.version == v1alpha1.ProxyV2 && (len(b) < 16 || b[13] != tc.famByte) {
				t.Errorf("v2 family and protocol byte % x, want %#02x", b, tc.famByte)
			}
			h := readBack(t, b)
			if h.TransportProtocol != tc.proto {
				t.Errorf("protocol %v, want %v", h.TransportProtocol, tc.proto)
			}
			if tc.client != "" {
				checkAddrs(t, h, tc.client, tc.listener)
			}
		})
	}
}

// readBack parses a header as a target would and checks nothing follows.
func readBack(t *testing.T, b []byte) *proxyproto.Header {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(append(bytes.Clone(b), "data"...)))
	h, err := proxyproto.Read(r)
	if err != nil {
		t.Fatalf("target cannot read header %q: %v", b, err)
	}
	if rest, _ := r.Peek(4); string(rest) != "data" {
		t.Fatalf("header %q: the bytes after it read as %q", b, rest)
	}
	return h
}

// checkAddrs: the header names client and listener, zones aside, IPv4 as
// IPv4 (a mapped address in a TCP6 header counts as its IPv4).
func checkAddrs(t *testing.T, h *proxyproto.Header, client, listener string) {
	t.Helper()
	norm := func(s string) netip.AddrPort {
		ap := netip.MustParseAddrPort(s)
		return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	}
	got := func(a net.Addr) netip.AddrPort {
		var ap netip.AddrPort
		switch a := a.(type) {
		case *net.TCPAddr:
			ap = a.AddrPort()
		case *net.UDPAddr:
			ap = a.AddrPort()
		}
		return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	}
	if g, w := got(h.SourceAddr), norm(client); g != w {
		t.Errorf("source %v, want %v", g, w)
	}
	if g, w := got(h.DestinationAddr), norm(listener); g != w {
		t.Errorf("destination %v, want %v", g, w)
	}
}

// Whatever the hop header carries (a peer writes it), the exit's PROXY
// header is one a target can read, and where both addresses parse it names
// them. Seeds hold IPv6, mapped, zoned and mixed-family pairs.
func FuzzProxyHeader(f *testing.F) {
	for _, s := range [][2]string{
		{"192.0.2.7:4242", "10.0.0.1:443"},
		{"[2001:db8::7]:4242", "[2001:db8::1]:443"},
		{"[::1]:1", "[::1]:65535"},
		{"[::ffff:192.0.2.7]:4242", "[::ffff:10.0.0.1]:443"},
		{"[fe80::7%eth0]:4242", "[fe80::1%eth0]:443"},
		{"192.0.2.7:4242", "[2001:db8::1]:443"},
		{"[2001:db8::7]:4242", "10.0.0.1:443"},
		{"[::]:0", "0.0.0.0:0"},
		{"", ""},
		{"[2001:db8::7]", "2001:db8::1:443"},
	} {
		for _, v := range []byte{1, 2} {
			f.Add(v, false, s[0], s[1])
			f.Add(v, true, s[0], s[1])
		}
	}
	f.Fuzz(func(t *testing.T, v byte, udp bool, client, listener string) {
		version := v1alpha1.ProxyV2
		if v%2 == 1 {
			version = v1alpha1.ProxyV1
			udp = false // a v1 Tunnel carries TCP only
		}
		b := proxyHeader(proxyTunnel(version), udp, client, listener)
		h := readBack(t, b)
		_, cerr := netip.ParseAddrPort(client)
		_, lerr := netip.ParseAddrPort(listener)
		if cerr == nil && lerr == nil {
			if h.TransportProtocol == proxyproto.UNSPEC {
				t.Fatalf("addresses %q %q made an UNSPEC header %q", client, listener, b)
			}
			checkAddrs(t, h, client, listener)
		}
	})
}
