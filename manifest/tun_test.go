package manifest

import (
	"net/netip"
	"testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// tunRoutes is a flow-mode Tunnel reaching an IPv4 and an IPv6 network.
func tunRoutes() *v1alpha1.Tunnel {
	return &v1alpha1.Tunnel{Spec: v1alpha1.TunnelSpec{Protocol: v1alpha1.ProtocolTUN,
		TUN: &v1alpha1.TunOptions{Address: "10.200.0.1/24", Routes: []string{"10.77.1.0/24", "fd77:1::/64"}}}}
}

// The targets a flow-mode exit dials for a tun Tunnel: inside its routes,
// in either family, and nothing else.
func TestTunReaches(t *testing.T) {
	tn := tunRoutes()
	for _, c := range []struct {
		target string
		ok     bool
	}{
		{"10.77.1.9:443", true},
		{"10.77.2.9:443", false},
		{"[fd77:1::9]:443", true},
		{"[fd77:1:0:0:ffff::1]:0", true},
		{"[fd77:2::9]:443", false},
		{"[fd77:1::9%eth0]:443", false},  // a zone names a link, not the route's network
		{"[::ffff:10.77.1.9]:443", true}, // IPv4-mapped: dialled as its IPv4 address
		{"[::ffff:10.77.2.9]:443", false},
		{"[::]:443", false},
		{"fd77:1::9:443", false}, // no brackets: not host:port
		{"[fd77:1::9]", false},
		{"", false},
	} {
		if got := TunReaches(tn, c.target); got != c.ok {
			t.Errorf("TunReaches(%q) = %v, want %v", c.target, got, c.ok)
		}
	}
	if TunReaches(&v1alpha1.Tunnel{}, "10.77.1.9:443") {
		t.Error("a Tunnel without spec.tun reaches a target")
	}
}

// Whatever a peer names as a target, one that is let through is an
// address without a zone that, as the exit dials it (IPv4-mapped as
// IPv4), lies in one of the routes of its own family.
func FuzzTunReaches(f *testing.F) {
	for _, s := range []string{"10.77.1.9:443", "[fd77:1::9]:443", "[::ffff:10.77.1.9]:0", "[fd77:1::9%lo]:1"} {
		f.Add(s)
	}
	tn := tunRoutes()
	f.Fuzz(func(t *testing.T, target string) {
		if !TunReaches(tn, target) {
			return
		}
		ap, err := netip.ParseAddrPort(target)
		if err != nil || ap.Addr().Zone() != "" {
			t.Fatalf("%q let through: %v", target, err)
		}
		a := ap.Addr().Unmap()
		for _, r := range tn.Spec.TUN.Routes {
			if p := netip.MustParsePrefix(r); p.Addr().Is4() == a.Is4() && p.Contains(a) {
				return
			}
		}
		t.Fatalf("%q let through, outside the routes", target)
	})
}
