package relay

import (
	"net/netip"
	"testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"golang.org/x/time/rate"
)

// A client host's share of a Tunnel's flows holds whichever address of its
// own it uses: an IPv6 host picks any of its /64's (before, each address
// was a new source with a fresh share).
func TestQuotaSourceIsAnIPv6Slash64(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hosts  []string
		refuse int // the first flow refused for its source, -1: none
	}{
		{"one IPv6 /64, many addresses", []string{"2001:db8::1", "2001:db8::2", "2001:db8::ffff:1"}, 2},
		{"neighbouring /64s", []string{"2001:db8:0:1::1", "2001:db8:0:2::1", "2001:db8:0:3::1"}, -1},
		{"IPv4 addresses", []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}, -1},
		{"one IPv4 host, mapped or not", []string{"192.0.2.1", "::ffff:192.0.2.1", "192.0.2.1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQuota(100, 100, 2)
			for i, h := range tc.hosts {
				reason := q.take("default/t", netip.MustParseAddr(h), 0)
				if want := i == tc.refuse; want != (reason == sourceLimit) {
					t.Fatalf("flow %d from %s: refused %q, want refused %v", i, h, reason, want)
				}
			}
			// Flows from any of a /64's addresses give back its share.
			for i, h := range tc.hosts {
				if i != tc.refuse {
					q.give("default/t", netip.MustParseAddr(h))
				}
			}
			if n := len(q.sources); n != 0 || q.inUse() != 0 {
				t.Fatalf("%d sources, %d flows left after every flow ended", n, q.inUse())
			}
		})
	}
}

// A Tunnel's own bound (spec.limits.maxFlows) holds below the relay's
// share for one Tunnel, never above it, and only for that Tunnel.
func TestQuotaTunnelsOwnBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tunnelMax int
		want      int // flows of the Tunnel taken before tunnel_limit
	}{
		{"its own bound", 3, 3},
		{"none", 0, 5},
		{"above the relay's share", 80, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newQuota(100, 5, 100)
			n := 0
			for q.take("default/t", netip.Addr{}, tc.tunnelMax) == "" {
				if n++; n > 100 {
					t.Fatal("no bound")
				}
			}
			if n != tc.want {
				t.Errorf("took %d flows, want %d", n, tc.want)
			}
			if r := q.take("default/t", netip.Addr{}, tc.tunnelMax); r != tunnelLimit {
				t.Errorf("past the bound: %q, want %q", r, tunnelLimit)
			}
			if r := q.take("default/other", netip.Addr{}, 0); r != "" {
				t.Errorf("another Tunnel refused: %q", r)
			}
		})
	}
}

func TestLimitsText(t *testing.T) {
	for _, tc := range []struct {
		l    *v1alpha1.TunnelLimits
		want string
	}{
		{nil, ""},
		{&v1alpha1.TunnelLimits{}, ""},
		{&v1alpha1.TunnelLimits{RateMbps: 20}, "20 Mbit/s"},
		{&v1alpha1.TunnelLimits{MaxFlows: 100}, "100 flows"},
		{&v1alpha1.TunnelLimits{RateMbps: 20, MaxFlows: 100}, "20 Mbit/s, 100 flows"},
	} {
		if got := limitsText(tc.l); got != tc.want {
			t.Errorf("limitsText(%+v) = %q, want %q", tc.l, got, tc.want)
		}
	}
}

// New manifests reach the buckets that open flows hold: a changed rate at
// once, a limit that went lets them go.
func TestRateLimitsFollowTheManifests(t *testing.T) {
	set := func(limits string) *manifest.Set {
		t.Helper()
		doc := `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: 17401}, endpoints: ["127.0.0.1:17401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: 17402}, endpoints: ["127.0.0.1:17402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: a, exit: b, route: [a, b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, listen: {port: 8080}, target: "10.0.0.1:80"` + limits + `}
`
		s, err := manifest.Parse("test.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var l rateLimits
	first := set(", limits: {rateMbps: 8}")
	tr := l.of(first.Tunnel("default/t"))
	if tr == nil || tr.up.Limit() != 1e6 {
		t.Fatalf("8 Mbit/s: %+v", tr)
	}
	l.sync(set(", limits: {rateMbps: 16}"))
	if tr.up.Limit() != 2e6 || tr.down.Limit() != 2e6 {
		t.Errorf("after the change to 16 Mbit/s the open flows' buckets run at %v and %v bytes a second", tr.up.Limit(), tr.down.Limit())
	}
	l.sync(set(""))
	if tr.up.Limit() != rate.Inf || len(l.tunnels) != 0 {
		t.Errorf("after the limit went: %v, %d buckets kept", tr.up.Limit(), len(l.tunnels))
	}
}
