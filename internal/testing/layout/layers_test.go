package layout

import (
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// relayLayers are the data plane's packages from the top down (the
// picture in docs/architecture.md's "A flow, hop by hop"). A package
// imports only packages of a lower layer, so a call never climbs back up:
// what a lower layer must tell an upper one goes through an interface the
// upper one gives it. Every package under relay/ has a place here.
var relayLayers = [][]string{
	{"relay/kube", "relay/local", "relay/metricsrv"}, // a relay process
	{"relay"}, // wiring, the roles, routes
	{"relay/admit", "relay/nexthop", "relay/probe"},                                  // policy, the link layer, probes
	{"relay/quic", "relay/tlslink", "relay/netstack", "relay/udpio"},                 // transports and sockets
	{"relay/flow", "relay/tun"},                                                      // flow ends, devices
	{"relay/hop", "relay/ratelog", "relay/egress", "relay/eyeballs", "relay/sockio"}, // encodings, warnings, egress, dialing both families, raw socket calls
}

// chainLogic is what decides routes and reads the manifests: the relay
// package asks it, and nothing below the relay package may, so the link
// layer cannot call back up for a route.
var chainLogic = []string{"route", "routectl", "manifest"}

// policy are the packages below the relay package that are about chains by
// nature: admit checks a header against the manifests, for the relay's
// dispatcher. They sit beside the link layer, never under it.
var policy = []string{"relay/admit"}

// layerOf is each package's layer, 0 the top.
func layerOf(layers [][]string) map[string]int {
	at := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			at[p] = i
		}
	}
	return at
}

// upward returns the imports among relay packages that do not go down a
// layer, and the relay packages the layers leave out.
func upward(layers [][]string, graph map[string][]string) []string {
	at := layerOf(layers)
	var bad []string
	for pkg, imps := range graph {
		if !matches("relay/...", pkg) {
			continue
		}
		from, ok := at[pkg]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s has no layer in internal/testing/layout's relayLayers", pkg))
			continue
		}
		for _, imp := range imps {
			if to, ok := at[imp]; ok && to <= from {
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d): imports go down", pkg, from, imp, to))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// reaches is every package of ours pkg depends on, directly or not.
func reaches(graph map[string][]string, pkg string) map[string]bool {
	seen := map[string]bool{}
	next := []string{pkg}
	for len(next) > 0 {
		p := next[len(next)-1]
		next = next[:len(next)-1]
		for _, imp := range graph[p] {
			if !seen[imp] {
				seen[imp] = true
				next = append(next, imp)
			}
		}
	}
	return seen
}

// routeFree returns the packages below the relay package, policy aside,
// that reach chain logic, even through another package.
func routeFree(graph map[string][]string) []string {
	var bad []string
	below := reaches(graph, "relay")
	for _, pkg := range slices.Sorted(maps.Keys(below)) {
		if !matches("relay/...", pkg) || slices.Contains(policy, pkg) {
			continue
		}
		deps := reaches(graph, pkg)
		for _, c := range chainLogic {
			if deps[c] {
				bad = append(bad, fmt.Sprintf("%s is below the relay package and reaches %s: route and chain logic stay above it", pkg, c))
			}
		}
	}
	return bad
}

func TestRelayLayersImportDownward(t *testing.T) {
	for _, v := range upward(relayLayers, imports(t, false)) {
		t.Error(v)
	}
}

func TestBelowTheRelayNoChainLogic(t *testing.T) {
	for _, v := range routeFree(imports(t, false)) {
		t.Error(v)
	}
}

// TestLayerChecksCatchThem: an import up or across a layer, a package with
// no layer, and chain logic reached below the relay package, directly or
// through another package, are reported; policy and the packages above
// the relay package may reach it.
func TestLayerChecksCatchThem(t *testing.T) {
	layers := [][]string{{"relay/local"}, {"relay"}, {"relay/nexthop", "relay/admit"}, {"relay/quic"}}
	graph := map[string][]string{
		"relay/local":   {"relay", "manifest"},
		"relay":         {"relay/nexthop", "relay/admit", "route"},
		"relay/nexthop": {"relay/quic", "relay/admit"},
		"relay/admit":   {"manifest"},
		"relay/quic":    {"relay/nexthop", "metrics"},
		"relay/new":     nil,
	}
	want := []string{
		"relay/new has no layer in internal/testing/layout's relayLayers",
		"relay/nexthop (layer 2) imports relay/admit (layer 2): imports go down",
		"relay/quic (layer 3) imports relay/nexthop (layer 2): imports go down",
	}
	if bad := upward(layers, graph); !slices.Equal(bad, want) {
		t.Errorf("upward: got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
	want = []string{
		"relay/nexthop is below the relay package and reaches manifest: route and chain logic stay above it",
		"relay/quic is below the relay package and reaches manifest: route and chain logic stay above it",
	}
	if bad := routeFree(graph); !slices.Equal(bad, want) {
		t.Errorf("routeFree: got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
}

// transports are what carries hops between relays: only the link layer
// (relay/nexthop) and the packages below it touch them. Above it a hop is
// a nexthop.Hop, whatever carries it, so a role is written once.
var transports = []string{"relay/quic", "relay/tlslink", "github.com/quic-go/..."}

// transportFree returns the imports of transports by packages of the
// layers above the link layer (top, the layers of the relay package and
// above); graph holds every import, ours and others', by package.
func transportFree(layers [][]string, top int, graph map[string][]string) []string {
	at := layerOf(layers)
	var bad []string
	for _, pkg := range slices.Sorted(maps.Keys(graph)) {
		if l, ok := at[pkg]; !ok || l > top {
			continue
		}
		for _, imp := range graph[pkg] {
			for _, tr := range transports {
				if matches(tr, imp) {
					bad = append(bad, fmt.Sprintf("%s imports %s: above the link layer a hop is a nexthop.Hop", pkg, imp))
				}
			}
		}
	}
	return bad
}

// allImports is every import of our packages under relay/ (tests left
// out), by package, ours without the module's prefix.
func allImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./relay/...")
	cmd.Dir = "../../.."
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module+"/")
		for _, imp := range f[1:] {
			out[pkg] = append(out[pkg], strings.TrimPrefix(imp, module+"/"))
		}
	}
	return out
}

func TestNoTransportAboveTheLinkLayer(t *testing.T) {
	for _, v := range transportFree(relayLayers, 1, allImports(t)) {
		t.Error(v)
	}
}

// TestTransportCheckCatchesThem: the relay package or one above it that
// imports a transport, ours or quic-go's, is reported; the link layer and
// the transports themselves are not.
func TestTransportCheckCatchesThem(t *testing.T) {
	layers := [][]string{{"relay/local"}, {"relay"}, {"relay/nexthop"}, {"relay/quic", "relay/tlslink"}}
	graph := map[string][]string{
		"relay/local":   {"relay", "relay/tlslink"},
		"relay":         {"relay/nexthop", "github.com/quic-go/quic-go", "net"},
		"relay/nexthop": {"relay/quic", "relay/tlslink", "github.com/quic-go/quic-go"},
		"relay/quic":    {"github.com/quic-go/quic-go/quicvarint"},
	}
	want := []string{
		"relay imports github.com/quic-go/quic-go: above the link layer a hop is a nexthop.Hop",
		"relay/local imports relay/tlslink: above the link layer a hop is a nexthop.Hop",
	}
	if bad := transportFree(layers, 1, graph); !slices.Equal(bad, want) {
		t.Errorf("transportFree: got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
}
