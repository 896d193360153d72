package egress

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

func testPolicy(own []netip.Addr, routes []netip.Prefix) *Policy {
	return &Policy{
		own:    func() ([]netip.Addr, error) { return own, nil },
		routes: func() ([]netip.Prefix, error) { return routes, nil },
	}
}

// TestCheck: the node's loopback, unspecified, link-local, metadata and
// own addresses are refused, in every spelling; cluster IPs, pods and the
// world are not.
func TestCheck(t *testing.T) {
	p := testPolicy([]netip.Addr{netip.MustParseAddr("172.18.0.3"), netip.MustParseAddr("fc00:f853:ccd:e793::3")}, nil)
	for _, c := range []struct {
		addr string
		what string // "" when allowed
	}{
		{"127.0.0.1", "loopback"},
		{"127.9.9.9", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"169.254.169.254", "link-local"},
		{"169.254.20.10", "link-local"},
		{"fe80::1", "link-local"},
		{"fd00:ec2::254", "metadata"},
		{"100.100.100.200", "metadata"},
		{"172.18.0.3", "node"},
		{"::ffff:172.18.0.3", "node"},
		{"fc00:f853:ccd:e793::3", "node"},
		{"10.96.0.1", ""},  // the API server's cluster IP
		{"10.96.0.10", ""}, // kube-dns
		{"10.244.1.7", ""}, // a pod
		{"172.18.0.4", ""}, // another node
		{"93.184.215.14", ""},
		{"2001:db8::1", ""},
	} {
		err := p.Check(netip.MustParseAddr(c.addr))
		switch {
		case c.what == "" && err != nil:
			t.Errorf("%s refused: %v", c.addr, err)
		case c.what != "" && err == nil:
			t.Errorf("%s allowed, want it refused (%s)", c.addr, c.what)
		case c.what != "" && !IsRefused(err):
			t.Errorf("%s: %v is not a refusal", c.addr, err)
		case c.what != "" && !strings.Contains(err.Error(), AllowLabel+"=true"):
			t.Errorf("%s: %q does not name the label that allows it", c.addr, err)
		}
	}
	var nilPolicy *Policy
	if err := nilPolicy.Check(netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Errorf("no policy refused loopback: %v", err)
	}
}

// TestDialerChecksTheResolvedAddress: a name that resolves to loopback is
// refused like the address, before any connection is made.
func TestDialerChecksTheResolvedAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	p := testPolicy(nil, nil)
	for _, target := range []string{ln.Addr().String(), "localhost:" + port} {
		if c, err := p.Dialer().Dial("tcp", target); err == nil || !IsRefused(err) {
			if c != nil {
				c.Close()
			}
			t.Errorf("dial %s: %v, want a refusal", target, err)
		}
	}
	if _, err := p.ResolveUDP("localhost:53"); !IsRefused(err) {
		t.Errorf("udp localhost: %v, want a refusal", err)
	}
	var none *Policy
	c, err := none.Dialer().Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("no policy: %v", err)
	}
	c.Close()
}

// TestCheckRoutes: a TUN route over one of the node's routes is refused
// (either way round); default routes and routes elsewhere are not.
func TestCheckRoutes(t *testing.T) {
	p := testPolicy(nil, []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"),     // default
		netip.MustParsePrefix("10.244.1.0/24"), // another node's pods
		netip.MustParsePrefix("172.18.0.0/16"), // the nodes' network
		netip.MustParsePrefix("fd00:10:244::/64"),
		netip.MustParsePrefix("::/0"), // IPv6's default
	})
	for _, c := range []struct {
		route string
		ok    bool
	}{
		{"10.77.0.0/16", true},
		{"10.200.0.0/24", true},
		{"10.244.1.0/24", false},
		{"10.244.1.128/25", false},
		{"10.0.0.0/8", false},
		{"172.18.0.5/32", false},
		{"fd00:10:244::/48", false},
		{"fd00:77::/64", true},
		{"fd00:10:244::5/128", false}, // one host of the node's IPv6 route
		{"fd00::/8", false},           // over it
		{"fd00:10:245::/64", true},    // beside it
		{"2001:db8::/32", true},       // IPv6's default route is no objection
		{"::/0", false},               // a default route into the device covers the node's
	} {
		err := p.CheckRoutes([]netip.Prefix{netip.MustParsePrefix(c.route)})
		if (err == nil) != c.ok || (err != nil && !IsRefused(err)) {
			t.Errorf("route %s: %v", c.route, err)
		}
	}
}
