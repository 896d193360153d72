package admit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
)

// relayNames are the relays of the fixture; mallory is in no manifest.
var relayNames = []string{"hk", "seattle", "la", "useast"}

func fixture(t testing.TB) *manifest.Set {
	t.Helper()
	var b strings.Builder
	for i, r := range relayNames {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n", r, 7401+i, 7401+i)
	}
	b.WriteString(`---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: static}
spec: {entry: hk, exit: la, via: [seattle], route: [hk, seattle, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fast}
spec: {entry: hk, exit: useast, via: [seattle, la], mode: sum, maxHops: 3}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: short}
spec: {entry: hk, exit: useast, via: [seattle, la], mode: pipe, maxHops: 2}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: web}
spec: {chain: static, listen: {port: 15200}, target: "127.0.0.1:80"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: dns}
spec: {chain: static, protocol: udp, listen: {port: 15201}, target: "127.0.0.1:53"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: api}
spec: {chain: fast, listen: {port: 15202}, target: "127.0.0.1:8080"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: subnet}
spec: {chain: static, protocol: tun, tun: {name: hl0, address: 10.200.0.1/24, routes: [10.77.1.0/24, "fd77:1::/64"]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: site}
spec: {chain: static, protocol: tun, tun: {name: hl1, address: 10.201.0.1/24, routes: [10.77.2.0/24], mode: packet}}
`)
	set, err := manifest.Parse("fixture.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestStream(t *testing.T) {
	set := fixture(t)
	tcp := func(tunnel string, route []string, target string) *hop.Header {
		return &hop.Header{Kind: hop.KindTCP, Tunnel: tunnel, Route: route, Target: target}
	}
	cases := []struct {
		name       string
		self, peer string
		h          *hop.Header
		tr         Transport
		reason     string // "" admits
		last       bool
	}{
		{"tcp middle", "seattle", "hk", tcp("default/web", []string{"seattle", "la"}, "127.0.0.1:80"), QUIC, "", false},
		{"tcp exit", "la", "seattle", tcp("default/web", []string{"la"}, "127.0.0.1:80"), QUIC, "", true},
		{"tcp exit over tls", "la", "seattle", tcp("default/web", []string{"la"}, "127.0.0.1:80"), TLS, "", true},
		{"unknown tunnel", "la", "seattle", tcp("default/nope", []string{"la"}, "127.0.0.1:80"), QUIC, UnknownTunnel, false},
		{"other namespace", "la", "seattle", tcp("other/web", []string{"la"}, "127.0.0.1:80"), QUIC, UnknownTunnel, false},
		{"udp header on a tcp tunnel", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/web", Route: []string{"la"}, Target: "127.0.0.1:80"}, QUIC, WrongProtocol, false},
		{"tcp header on a udp tunnel", "la", "seattle", tcp("default/dns", []string{"la"}, "127.0.0.1:53"), QUIC, WrongProtocol, false},
		{"udp exit", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/dns", Route: []string{"la"}, Target: "127.0.0.1:53"}, QUIC, "", true},
		{"udp over tls", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/dns", Route: []string{"la"}, Target: "127.0.0.1:53"}, TLS, "", true},
		{"skips a relay", "la", "hk", tcp("default/web", []string{"la"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"peer lies about its place", "seattle", "la", tcp("default/web", []string{"seattle", "la"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"route past the exit", "la", "seattle", tcp("default/web", []string{"la", "useast"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"route not starting here", "seattle", "hk", tcp("default/web", []string{"la"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"from itself", "la", "la", tcp("default/web", []string{"la"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"no peer", "la", "", tcp("default/web", []string{"la"}, "127.0.0.1:80"), QUIC, BadRoute, false},
		{"another target", "la", "seattle", tcp("default/web", []string{"la"}, "127.0.0.1:22"), QUIC, BadTarget, false},
		{"routed chain, any allowed route", "useast", "hk", tcp("default/api", []string{"useast"}, "127.0.0.1:8080"), QUIC, "", true},
		{"routed chain, via relays", "la", "seattle", tcp("default/api", []string{"la", "useast"}, "127.0.0.1:8080"), QUIC, "", false},
		{"routed chain, from a via relay", "useast", "la", tcp("default/api", []string{"useast"}, "127.0.0.1:8080"), QUIC, "", true},
		{"routed chain, relay twice", "la", "seattle", tcp("default/api", []string{"la", "seattle", "useast"}, "127.0.0.1:8080"), QUIC, BadRoute, false},
		{"tun flow inside routes", "la", "seattle", tcp("default/subnet", []string{"la"}, "10.77.1.9:443"), QUIC, "", true},
		{"tun flow outside routes", "la", "seattle", tcp("default/subnet", []string{"la"}, "10.50.0.2:443"), QUIC, BadTarget, false},
		{"tun flow udp", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.9:53"}, QUIC, "", true},
		{"tun flow udp over tls", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.9:53"}, TLS, WrongProtocol, false},
		{"tun flow echo", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.9:0"}, QUIC, "", true},
		{"tun flow echo outside routes", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.50.0.2:0"}, QUIC, BadTarget, false},
		{"tun flow echo with a port", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.9:7"}, QUIC, BadTarget, false},
		{"tun flow echo over tls", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "10.77.1.9:0"}, TLS, WrongProtocol, false},
		{"tun flow IPv6", "la", "seattle", tcp("default/subnet", []string{"la"}, "[fd77:1::9]:443"), QUIC, "", true},
		{"tun flow IPv6 outside routes", "la", "seattle", tcp("default/subnet", []string{"la"}, "[fd77:2::9]:443"), QUIC, BadTarget, false},
		{"tun flow IPv6 with a zone", "la", "seattle", tcp("default/subnet", []string{"la"}, "[fd77:1::9%eth0]:443"), QUIC, BadTarget, false},
		{"tun flow IPv4-mapped, as its IPv4 address", "la", "seattle", tcp("default/subnet", []string{"la"}, "[::ffff:10.77.1.9]:443"), QUIC, "", true},
		{"tun flow IPv4-mapped outside routes", "la", "seattle", tcp("default/subnet", []string{"la"}, "[::ffff:10.50.0.2]:443"), QUIC, BadTarget, false},
		{"tun flow udp IPv6", "la", "seattle", &hop.Header{Kind: hop.KindUDP, Tunnel: "default/subnet", Route: []string{"la"}, Target: "[fd77:1::9]:53"}, QUIC, "", true},
		{"tun flow echo IPv6", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "[fd77:1::9]:0"}, QUIC, "", true},
		{"tun flow echo IPv6 with a port", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "[fd77:1::9]:7"}, QUIC, BadTarget, false},
		{"tun flow echo IPv6 outside routes", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/subnet", Route: []string{"la"}, Target: "[fd50::2]:0"}, QUIC, BadTarget, false},
		{"echo header on a packet-mode tunnel", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/site", Route: []string{"la"}, Target: "10.77.2.1:0"}, QUIC, WrongProtocol, false},
		{"echo header on a udp tunnel", "la", "seattle", &hop.Header{Kind: hop.KindEcho, Tunnel: "default/dns", Route: []string{"la"}, Target: "127.0.0.1:0"}, QUIC, WrongProtocol, false},
		{"packet header on a flow-mode tunnel", "la", "seattle", &hop.Header{Kind: hop.KindPacket, Tunnel: "default/subnet", Route: []string{"la"}}, QUIC, WrongProtocol, false},
		{"packet session", "la", "seattle", &hop.Header{Kind: hop.KindPacket, Tunnel: "default/site", Route: []string{"la"}}, TLS, "", true},
		{"tcp header on a packet-mode tunnel", "la", "seattle", tcp("default/site", []string{"la"}, "10.77.2.1:80"), QUIC, WrongProtocol, false},
		{"trace", "la", "hk", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/fast", Route: []string{"la", "useast"}}, TLS, "", false},
		{"trace at the exit", "useast", "la", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/fast", Route: []string{"useast"}}, QUIC, "", true},
		{"trace of a static chain", "la", "seattle", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/static", Route: []string{"la"}}, QUIC, "", true},
		{"trace of a static chain off its route", "la", "hk", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/static", Route: []string{"la"}}, QUIC, BadRoute, false},
		{"trace of no chain", "la", "seattle", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/web", Route: []string{"la"}}, QUIC, UnknownChain, false},
		{"trace off the routes", "la", "useast", &hop.Header{Kind: hop.KindTrace, Tunnel: "default/fast", Route: []string{"la", "useast"}}, QUIC, BadRoute, false},
		{"link request", "la", "hk", &hop.Header{Kind: hop.KindLinks, Tunnel: "default/fast", Route: []string{"la"}}, QUIC, "", true},
		{"link request passed on", "seattle", "hk", &hop.Header{Kind: hop.KindLinks, Tunnel: "default/fast", Route: []string{"seattle", "la"}}, QUIC, "", false},
		{"link request over tls", "la", "hk", &hop.Header{Kind: hop.KindLinks, Tunnel: "default/fast", Route: []string{"la"}}, TLS, WrongProtocol, false},
		{"link request from the exit", "la", "useast", &hop.Header{Kind: hop.KindLinks, Tunnel: "default/fast", Route: []string{"la"}}, QUIC, BadRoute, false},
		{"link request longer than any route", "la", "seattle", &hop.Header{Kind: hop.KindLinks, Tunnel: "default/short", Route: []string{"la"}}, QUIC, BadRoute, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, ref := Stream(set, c.self, c.peer, c.h, c.tr, time.Now())
			if c.reason == "" {
				if ref != nil {
					t.Fatalf("refused: %v (%s)", ref, ref.Reason)
				}
				if g.Chain == nil || g.Last != c.last {
					t.Fatalf("grant %+v, want a chain and last=%v", g, c.last)
				}
				if c.h.Kind != hop.KindTrace && c.h.Kind != hop.KindLinks && g.Tunnel == nil {
					t.Fatalf("grant of a %s stream without its Tunnel", c.h.Kind)
				}
				return
			}
			if ref == nil {
				t.Fatalf("admitted %+v, want %s", g, c.reason)
			}
			if ref.Reason != c.reason || ref.Err == nil || ref.Error() == "" {
				t.Fatalf("refused as %s (%v), want %s", ref.Reason, ref, c.reason)
			}
		})
	}
}

func TestAdmin(t *testing.T) {
	set := fixture(t)
	cases := []struct {
		name, self, client string
		call               AdminCall
		chain, reason      string
	}{
		{"links", "la", pki.OperatorName, AdminLinks, "default/fast", ""},
		{"links at the entry", "hk", pki.OperatorName, AdminLinks, "default/fast", ""},
		{"trace at the entry", "hk", pki.OperatorName, AdminTrace, "default/fast", ""},
		{"a relay's certificate", "la", "hk", AdminLinks, "default/fast", NotOperator},
		{"no certificate name", "la", "", AdminLinks, "default/fast", NotOperator},
		{"unknown chain", "la", pki.OperatorName, AdminLinks, "default/nope", UnknownChain},
		{"static chain", "la", pki.OperatorName, AdminLinks, "default/static", UnknownChain},
		{"not on the chain", "la", pki.OperatorName, AdminLinks, "default/static-or-none", UnknownChain},
		{"observer: links of a static chain", "seattle", pki.ObserverName, AdminLinks, "default/static", ""},
		{"observer: trace of a static chain", "hk", pki.ObserverName, AdminTrace, "default/static", ""},
		{"observer: links off the chain", "useast", pki.ObserverName, AdminLinks, "default/static", NotMember},
		{"observer: trace away from the entry", "la", pki.ObserverName, AdminTrace, "default/static", NotEntry},
		{"via relay of a one-hop chain", "seattle", pki.OperatorName, AdminLinks, "default/fast", ""},
		{"trace away from the entry", "la", pki.OperatorName, AdminTrace, "default/fast", NotEntry},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ch, ref := Admin(set, c.self, c.client, c.call, c.chain)
			if c.reason == "" {
				if ref != nil || ch == nil {
					t.Fatalf("refused: %v", ref)
				}
				return
			}
			if ref == nil || ref.Reason != c.reason {
				t.Fatalf("got %v, want %s", ref, c.reason)
			}
		})
	}
	// A relay that a chain's rounds never ask has no table to give.
	if _, ref := Admin(set, "mallory", pki.OperatorName, AdminLinks, "default/fast"); ref == nil || ref.Reason != NotMember {
		t.Fatalf("a relay off the chain answered: %v", ref)
	}
}

func TestTraceRoute(t *testing.T) {
	c := fixture(t).Chain("default/fast")
	for _, rt := range [][]string{{"hk", "useast"}, {"hk", "la", "useast"}, {"hk", "seattle", "la", "useast"}} {
		if ref := TraceRoute(c, "hk", rt); ref != nil {
			t.Errorf("%v: %v", rt, ref)
		}
	}
	for _, rt := range [][]string{{"hk"}, {"la", "useast"}, {"hk", "seattle", "hk", "useast"}, {"hk", "mallory", "useast"}} {
		if ref := TraceRoute(c, "hk", rt); ref == nil || ref.Reason != BadRoute {
			t.Errorf("%v: traced (%v)", rt, ref)
		}
	}
	if ref := TraceRoute(c, "la", []string{"hk", "useast"}); ref == nil {
		t.Error("a relay traced a route it is not the entry of")
	}
}

// allowedRoutes lists every route chain c allows: its static route, or
// every route its spec does (entry, via relays each at most once, exit,
// within maxHops).
func allowedRoutes(c *v1alpha1.Chain) [][]string {
	if !c.Spec.Mode.Routed() {
		return [][]string{c.Spec.Route}
	}
	var out [][]string
	var walk func(path []string)
	walk = func(path []string) {
		if len(path)-1 >= int(c.Spec.MaxHops) {
			return
		}
		if len(path) > 0 {
			out = append(out, append(slices.Clone(path), c.Spec.Exit))
		}
		for _, v := range c.Spec.Via {
			if !slices.Contains(path, v) {
				walk(append(slices.Clone(path), v))
			}
		}
	}
	walk([]string{c.Spec.Entry})
	return out
}

// segmentAfter says whether some allowed route has peer right before rest,
// with rest running to the route's end (whole) or anywhere along it.
func segmentAfter(routes [][]string, peer string, rest []string, whole bool) bool {
	for _, r := range routes {
		for i := 1; i+len(rest) <= len(r); i++ {
			if r[i-1] != peer || !slices.Equal(r[i:i+len(rest)], rest) {
				continue
			}
			if !whole || i+len(rest) == len(r) {
				return true
			}
		}
	}
	return false
}

// sequences lists every sequence of 1 to 4 distinct names, with a stranger
// and a repeat or two for good measure.
func sequences() [][]string {
	names := append(slices.Clone(relayNames), "mallory")
	var out [][]string
	var walk func(seq []string)
	walk = func(seq []string) {
		if len(seq) > 0 {
			out = append(out, slices.Clone(seq))
		}
		if len(seq) == 4 {
			return
		}
		for _, n := range names {
			if !slices.Contains(seq, n) {
				walk(append(seq, n))
			}
		}
	}
	walk(nil)
	return append(out, []string{"la", "la"}, []string{"seattle", "la", "seattle", "useast"})
}

// TestOnlySuffixesOfAllowedRoutes checks, over every peer, relay and route
// a header can name, that a relay admits a flow or trace exactly when the
// route is the rest of a route its Chain allows after the peer that sent
// it, and a link request exactly when its path follows the peer along one.
func TestOnlySuffixesOfAllowedRoutes(t *testing.T) {
	set := fixture(t)
	seqs := sequences()
	targets := map[string]string{"default/web": "127.0.0.1:80", "default/api": "127.0.0.1:8080"}
	checked := 0
	for _, c := range set.Chains {
		routes := allowedRoutes(c)
		key := manifest.Key(c.Namespace, c.Name)
		for _, peer := range append(slices.Clone(relayNames), "mallory") {
			for _, rest := range seqs {
				self := rest[0]
				for tunnel, target := range targets {
					if set.Tunnel(tunnel).Spec.Chain != c.Name {
						continue
					}
					_, ref := Stream(set, self, peer, &hop.Header{Kind: hop.KindTCP, Tunnel: tunnel, Route: rest, Target: target}, QUIC, time.Now())
					if want := peer != self && segmentAfter(routes, peer, rest, true); (ref == nil) != want {
						t.Errorf("flow of %s at %s from %s along %v: admitted=%v, want %v (%v)", tunnel, self, peer, rest, ref == nil, want, ref)
					}
					checked++
				}
				if !c.Spec.Mode.Routed() {
					continue
				}
				_, ref := Stream(set, self, peer, &hop.Header{Kind: hop.KindTrace, Tunnel: key, Route: rest}, QUIC, time.Now())
				if want := peer != self && segmentAfter(routes, peer, rest, true); (ref == nil) != want {
					t.Errorf("trace of %s at %s from %s along %v: admitted=%v, want %v (%v)", key, self, peer, rest, ref == nil, want, ref)
				}
				_, ref = Stream(set, self, peer, &hop.Header{Kind: hop.KindLinks, Tunnel: key, Route: rest}, QUIC, time.Now())
				if want := peer != self && segmentAfter(routes, peer, rest, false); (ref == nil) != want {
					t.Errorf("link request of %s at %s from %s along %v: admitted=%v, want %v (%v)", key, self, peer, rest, ref == nil, want, ref)
				}
				checked += 2
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("checked only %d cases", checked)
	}
}

// FuzzStream admits whatever header bytes a peer may send: it never
// panics, and what it admits is a suffix of an allowed route.
func FuzzStream(f *testing.F) {
	set := fixture(f)
	for _, h := range []hop.Header{
		{Kind: hop.KindTCP, Tunnel: "default/web", Route: []string{"la"}, Target: "127.0.0.1:80"},
		{Kind: hop.KindUDP, Tunnel: "default/dns", Route: []string{"seattle", "la"}, Target: "127.0.0.1:53"},
		{Kind: hop.KindTrace, Tunnel: "default/fast", Route: []string{"la", "useast"}},
		{Kind: hop.KindLinks, Tunnel: "default/fast", Route: []string{"seattle", "la"}},
		{Kind: hop.KindPacket, Tunnel: "default/site", Route: []string{"la"}},
	} {
		b, err := h.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "seattle", uint8(0))
	}
	f.Fuzz(func(t *testing.T, b []byte, peer string, tr uint8) {
		h, err := hop.Parse(b)
		if err != nil {
			return
		}
		self := h.Route[0]
		g, ref := Stream(set, self, peer, &h, Transport(tr%2), time.Now())
		if ref != nil {
			if ref.Reason == "" || ref.Err == nil {
				t.Fatalf("refusal without a reason: %+v", ref)
			}
			return
		}
		if g.Chain == nil {
			t.Fatal("admitted without a chain")
		}
		whole := h.Kind != hop.KindLinks
		if !segmentAfter(allowedRoutes(g.Chain), peer, h.Route, whole) {
			t.Fatalf("admitted %s along %v from %q, on no route of %s", h.Kind, h.Route, peer, g.Chain.Name)
		}
		if g.Tunnel != nil && h.Kind == hop.KindTCP && g.Tunnel.Spec.TUN == nil && h.Target != g.Tunnel.Spec.Target {
			t.Fatalf("admitted target %q of Tunnel %s", h.Target, g.Tunnel.Name)
		}
	})
}

func TestRefusalUnwraps(t *testing.T) {
	ref := refuse(BadRoute, "x %d", 1)
	var r *Refusal
	if !errors.As(error(ref), &r) || r.Reason != BadRoute || ref.Error() != "x 1" {
		t.Fatal(ref)
	}
}

// TestStreamOnAVersion: while a Chain's relays converge on an edit, a
// relay admits hops of the spec it ran before for as long as that version
// lives, and of an edit it waits to take; never beyond, and never a route
// neither spec has.
func TestStreamOnAVersion(t *testing.T) {
	base := fixture(t)
	now := time.Now()
	// The static chain's route was hk, la (the edit put seattle in).
	before := base.Chain("default/static").DeepCopy()
	before.Spec.Via, before.Spec.Route = nil, []string{"hk", "la"}
	// An edit la waits to take: hk, useast, la.
	pending := base.Chain("default/static").DeepCopy()
	pending.Spec.Via, pending.Spec.Route = []string{"useast"}, []string{"hk", "useast", "la"}
	web := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/web", Route: []string{"la"}, Target: "127.0.0.1:80"}
	cases := []struct {
		name     string
		versions []manifest.Version
		peer     string
		at       time.Time
		reason   string
	}{
		{"no version: the old hop is refused", nil, "hk", now, BadRoute},
		{"the spec before, within its grace", []manifest.Version{{Chain: before, Until: now.Add(time.Second)}}, "hk", now, ""},
		{"the spec before, after its grace", []manifest.Version{{Chain: before, Until: now.Add(time.Second)}}, "hk", now.Add(2 * time.Second), BadRoute},
		{"the edit it waits for", []manifest.Version{{Chain: pending}}, "useast", now.Add(time.Hour), ""},
		{"a hop in no version", []manifest.Version{{Chain: before, Until: now.Add(time.Second)}, {Chain: pending}}, "mallory", now, BadRoute},
		{"the current spec still", []manifest.Version{{Chain: before, Until: now.Add(time.Second)}}, "seattle", now.Add(time.Hour), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set := base
			if c.versions != nil {
				set = base.WithVersions(map[string][]manifest.Version{"default/static": c.versions})
			}
			_, ref := Stream(set, "la", c.peer, web, QUIC, c.at)
			switch {
			case c.reason == "" && ref != nil:
				t.Fatalf("refused: %v", ref)
			case c.reason != "" && (ref == nil || ref.Reason != c.reason):
				t.Fatalf("got %v, want a %s refusal", ref, c.reason)
			}
		})
	}
}
