//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/manifest"
)

func TestParsePaths(t *testing.T) {
	ps, err := parsePaths([]string{"direct", "tunchain", "tun1hop", "chain"}, []string{"auto", "tls"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	want := []string{"direct", "3 hops, tun flow, auto", "3 hops, tun flow, tls", "1 hop, tun flow, auto", "1 hop, tun flow, tls", "3 hops, auto", "3 hops, tls"}
	if len(got) != len(want) {
		t.Fatalf("paths %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("path %d: %q, want %q", i, got[i], want[i])
		}
	}
	for _, bad := range [][2]string{{"tun", "auto"}, {"tunchain", "udp"}} {
		if _, err := parsePaths([]string{bad[0]}, []string{bad[1]}, 3); err == nil {
			t.Errorf("-paths %s -transports %s: no error", bad[0], bad[1])
		}
	}
}

// TestManifests checks that the relays' manifests load, and that a tun
// path's Tunnel routes into its device the address the client dials, and
// nothing another path's does.
func TestManifests(t *testing.T) {
	var nodes []*linkemu.Node
	for i, name := range []string{"hk", "seattle", "la", "useast"} {
		nodes = append(nodes, &linkemu.Node{Name: name, Addr: netip.AddrFrom4([4]byte{10, 213, 0, byte(i + 1)})})
	}
	ps := []path{{}, {3, "auto", true}, {1, "auto", true}, {3, "auto", false}}
	set, err := manifest.Parse("m.yaml", []byte(manifests(nodes, ps, udpOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	nw := &network{nodes: nodes}
	for i, p := range ps {
		if !p.tun {
			continue
		}
		tn := set.Tunnel(manifest.Key(manifest.DefaultNamespace, fmt.Sprintf("t%d", i)))
		if tn == nil || tn.Spec.Protocol != v1alpha1.ProtocolTUN || tn.Spec.TUN.Mode != v1alpha1.TunFlow {
			t.Fatalf("path %d (%s): Tunnel %+v, want a flow-mode tun Tunnel", i, p, tn)
		}
		if got := manifest.Route(set.ChainOf(tn)); len(got) != p.hops+1 {
			t.Errorf("path %d (%s): route %v", i, p, got)
		}
		dst := netip.MustParseAddrPort(nw.pathAddr(i, p, echoPort))
		for j, q := range ps {
			if q.tun && manifest.PrefixesHold(tn.Spec.TUN.Routes, tunTarget(j)) != (i == j) {
				t.Errorf("path %d's routes %v and path %d's target %v", i, tn.Spec.TUN.Routes, j, tunTarget(j))
			}
		}
		if dst.Addr() != tunTarget(i) || dst.Port() != echoPort {
			t.Errorf("path %d dials %v", i, dst)
		}
	}
}
