package srcaddr

import (
	"net"
	"net/netip"
	"testing"
)

func TestKey(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"192.0.2.1", "192.0.2.1/32"},
		{"::ffff:192.0.2.1", "192.0.2.1/32"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
	} {
		if got := Key(netip.MustParseAddr(tc.a)); got != netip.MustParsePrefix(tc.b) {
			t.Errorf("Key(%s) = %s, want %s", tc.a, got, tc.b)
		}
	}
	if Key(netip.Addr{}).IsValid() {
		t.Error("the zero Addr has a key")
	}
}

func TestSameSource(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"2001:db8::1", "2001:db8::ffff:1", true},     // one /64: one host's privacy addresses
		{"2001:db8:0:1::1", "2001:db8:0:2::1", false}, // neighbouring /64s
		{"192.0.2.1", "192.0.2.2", false},             // IPv4: the address
		{"192.0.2.1", "::ffff:192.0.2.1", true},       // one host over a dual-stack socket
	} {
		if got := Key(netip.MustParseAddr(tc.a)) == Key(netip.MustParseAddr(tc.b)); got != tc.same {
			t.Errorf("%s and %s: same source %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

func TestOf(t *testing.T) {
	tcp := &net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 1}
	udp := &net.UDPAddr{IP: net.ParseIP("10.0.0.1"), Port: 1}
	if got := Of(tcp); got != netip.MustParsePrefix("2001:db8::/64") {
		t.Errorf("Of(tcp) = %s", got)
	}
	if got := Of(udp); got != netip.MustParsePrefix("10.0.0.1/32") {
		t.Errorf("Of(udp) = %s", got)
	}
	if got := Of(&net.UnixAddr{Name: "x"}); got.IsValid() {
		t.Errorf("Of(unix) = %s", got)
	}
}
