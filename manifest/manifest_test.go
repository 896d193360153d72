package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const relays = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: seattle}
spec: {listen: {port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7403}, endpoints: ["127.0.0.1:7403"]}
`

const chain = `
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: to-east}
spec: {entry: hk, exit: la, via: [seattle], route: [hk, seattle, la]}
`

// routed is a sum-mode chain over the three relays, with no route written.
const routed = `
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fast}
spec: {entry: hk, exit: la, via: [seattle], mode: sum, maxHops: 4}
`

const tunnel = `
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: iperf}
spec: {chain: to-east, listen: {address: 127.0.0.1, port: 15202}, target: "127.0.0.1:5201"}
`

func tunTunnel(tun string) string {
	return "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: sub}\nspec: {chain: to-east, protocol: tun, " + tun + "}\n"
}

func TestLoadGood(t *testing.T) {
	s, err := Parse("good.yaml", []byte(relays+chain+tunnel+`
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Relays) != 3 || len(s.Chains) != 1 || len(s.Tunnels) != 1 || len(s.Skipped) != 1 {
		t.Fatalf("got %d relays, %d chains, %d tunnels, %d skipped", len(s.Relays), len(s.Chains), len(s.Tunnels), len(s.Skipped))
	}
	tn := s.Tunnel("default/iperf")
	if tn == nil || tn.Spec.Protocol != "tcp" || s.ChainOf(tn).Spec.Mode != "static" {
		t.Fatalf("defaults not applied: %+v", tn)
	}
	if got := s.NextHops("hk"); len(got) != 1 || got[0] != "seattle" {
		t.Fatalf("NextHops(hk) = %v", got)
	}
	if got := s.EntryTunnels("hk"); len(got) != 1 {
		t.Fatalf("EntryTunnels(hk) = %v", got)
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown relay in route",
			relays + strings.Replace(chain, "route: [hk, seattle, la]", "route: [hk, seatle, la]", 1) + tunnel,
			[]string{`bad.yaml (document 4): Chain "default/to-east": spec.route[1]: unknown RelayNode "seatle" (known: hk, seattle, la); did you mean "seattle"?`}},
		{"tcp options on a udp tunnel",
			relays + chain + strings.Replace(tunnel, "target:", "protocol: udp, tcp: {idleTimeoutSeconds: 5}, target:", 1),
			[]string{`Tunnel "default/iperf": spec.tcp: applies to protocol tcp only`}},
		{"tcp idle timeout over a week",
			relays + chain + strings.Replace(tunnel, "target:", "tcp: {idleTimeoutSeconds: 604801}, target:", 1),
			[]string{`spec.tcp.idleTimeoutSeconds: 604801 must be from 1 to 604800`}},
		{"unknown udp mode",
			relays + chain + strings.Replace(tunnel, "target:", "protocol: udp, udp: {mode: bulk}, target:", 1),
			[]string{`Tunnel "default/iperf": spec.udp.mode: "bulk" is not a mode; use auto, datagram or stream`}},
		{"unknown transport",
			relays + strings.Replace(chain, "route: [hk, seattle, la]", "route: [hk, seattle, la], transport: tcp", 1) + tunnel,
			[]string{`spec.transport: "tcp" is not a transport; use auto, quic or tls`}},
		{"route not starting at entry",
			relays + strings.Replace(chain, "route: [hk, seattle, la]", "route: [seattle, la]", 1),
			[]string{`spec.route[0]: "seattle" must be the entry "hk"`}},
		{"route not ending at exit",
			relays + strings.Replace(chain, "route: [hk, seattle, la]", "route: [hk, seattle]", 1),
			[]string{`spec.route[1]: "seattle" must be the exit "la"`}},
		{"relay twice",
			relays + strings.Replace(chain, "route: [hk, seattle, la]", "route: [hk, seattle, seattle, la]", 1),
			[]string{`spec.route[2]: "seattle" appears twice`}},
		{"hop not in via",
			relays + strings.Replace(chain, "via: [seattle], ", "", 1),
			[]string{`spec.route[1]: "seattle" is not in spec.via`}},
		{"static without route",
			relays + strings.Replace(chain, ", route: [hk, seattle, la]", "", 1),
			[]string{`spec.route: required for static mode`}},
		{"unknown mode",
			relays + strings.Replace(chain, "entry: hk", "mode: fastest, entry: hk", 1),
			[]string{`spec.mode: "fastest" is not a mode; use static, sum or pipe`}},
		{"relay port out of range",
			strings.Replace(relays, "port: 7401", "port: 70000", 1),
			[]string{`RelayNode "hk": spec.listen.port: 70000 is out of range; use 1-65535`}},
		{"tunnel port out of range",
			relays + chain + strings.Replace(tunnel, "port: 15202", "port: 0", 1),
			[]string{`Tunnel "default/iperf": spec.listen.port: 0 is out of range`}},
		{"missing endpoints",
			strings.Replace(relays, `endpoints: ["127.0.0.1:7402"]`, ``, 1) + chain,
			[]string{`RelayNode "seattle": spec.endpoints: required: relay "seattle" is hop 1 of Chain "default/to-east", so peers must know where to dial it: ` +
				`give the address or name other hosts reach its host at, e.g. endpoints: ["seattle.example.net:7402"] (or ["127.0.0.1:7402"] when every relay runs on one host, as with hoplink local)`}},
		{"missing endpoints of a relay listening on one address",
			strings.Replace(relays, `{port: 7402}, endpoints: ["127.0.0.1:7402"]`, `{address: "fd00::7", port: 7402}`, 1) + chain,
			[]string{`RelayNode "seattle": spec.endpoints: required: relay "seattle" is hop 1 of Chain "default/to-east", so peers must know where to dial it: it listens on fd00::7 only, so endpoints: ["[fd00::7]:7402"]`}},
		{"bad endpoint",
			strings.Replace(relays, `"127.0.0.1:7402"`, `"127.0.0.1"`, 1),
			[]string{`RelayNode "seattle": spec.endpoints[0]: "127.0.0.1" is not host:port`}},
		{"duplicate tunnel listen",
			relays + chain + tunnel + strings.Replace(tunnel, "name: iperf", "name: other", 1),
			[]string{`Tunnel "default/other": spec.listen: tcp 127.0.0.1:15202 collides with Tunnel "default/iperf" on entry relay "hk"`}},
		{"wildcard collides",
			relays + chain + tunnel + strings.Replace(strings.Replace(tunnel, "name: iperf", "name: other", 1), "address: 127.0.0.1, ", "", 1),
			[]string{`collides with Tunnel "default/iperf"`}},
		{"unknown chain",
			relays + chain + strings.Replace(tunnel, "chain: to-east", "chain: to-west", 1),
			[]string{`Tunnel "default/iperf": spec.chain: unknown Chain "to-west" in namespace "default" (it has: to-east)`}},
		{"chain name with a typo",
			relays + chain + strings.Replace(tunnel, "chain: to-east", "chain: to-eats", 1),
			[]string{`Tunnel "default/iperf": spec.chain: unknown Chain "to-eats" in namespace "default" (it has: to-east); did you mean "to-east"?`}},
		{"bad target",
			relays + chain + strings.Replace(tunnel, `"127.0.0.1:5201"`, `"127.0.0.1"`, 1),
			[]string{`spec.target: "127.0.0.1" is not host:port`}},
		{"bad protocol",
			relays + chain + strings.Replace(tunnel, "chain: to-east", "chain: to-east, protocol: sctp", 1),
			[]string{`spec.protocol: "sctp" is not supported; use tcp, udp or tun`}},
		{"tun with listen and target",
			relays + chain + strings.Replace(tunnel, "chain: to-east", "chain: to-east, protocol: tun, tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}", 1),
			[]string{`spec.listen: protocol tun opens no listener`, `spec.target: protocol tun reaches the destinations of spec.tun.routes`}},
		{"tun without tun",
			relays + chain + tunTunnel(""),
			[]string{`spec.tun: required for protocol tun`}},
		{"tun fields",
			relays + chain + tunTunnel("tun: {name: way-too-long-name, address: 10.200.0.1, mtu: 100, routes: [10.77.1.0/16, nope], mode: packet, exitAddress: 10.9.0.2/24}"),
			[]string{`spec.tun.name: "way-too-long-name" is not a device name`, `spec.tun.address: "10.200.0.1" is not an address with its prefix`,
				`spec.tun.mtu: 100 is out of range`, `spec.tun.routes[0]: "10.77.1.0/16" has host bits set; write 10.77.0.0/16`,
				`spec.tun.routes[1]: "nope" is not a prefix`}},
		{"tun IPv6 fields",
			relays + chain + tunTunnel(`tun: {address: "fd20::1", mtu: 1200, routes: ["fd77:1::1/64", "::ffff:10.77.0.0/112", "fe80::1%eth0/64", "fd77:2::/64"]}`),
			[]string{`spec.tun.address: "fd20::1" is not an address with its prefix`,
				`spec.tun.mtu: 1200 is below 1280, the least IPv6 allows, and the device carries IPv6; use 1280-9000`,
				`spec.tun.routes[0]: "fd77:1::1/64" has host bits set; write fd77:1::/64`,
				`spec.tun.routes[1]: "::ffff:10.77.0.0/112" is IPv4-mapped IPv6, which no packet carries; write 10.77.0.0/16`,
				`spec.tun.routes[2]: "fe80::1%eth0/64" is not a prefix`}},
		{"tun IPv4 device routing IPv6 below 1280",
			relays + chain + tunTunnel(`tun: {address: 10.200.0.1/24, mtu: 1279, routes: [10.77.0.0/16, "fd77::/64"]}`),
			[]string{`spec.tun.mtu: 1279 is below 1280, the least IPv6 allows`}},
		{"tun IPv6 device below 1280",
			relays + chain + tunTunnel(`tun: {address: "fd20::1/64", mtu: 1000, routes: ["fd77::/64"], mode: packet}`),
			[]string{`spec.tun.mtu: 1000 is below 1280, the least IPv6 allows`}},
		{"tun IPv4-mapped address",
			relays + chain + tunTunnel(`tun: {address: "::ffff:10.200.0.1/120", routes: [10.77.0.0/16]}`),
			[]string{`spec.tun.address: "::ffff:10.200.0.1/120" is IPv4-mapped IPv6, which never crosses a device; write 10.200.0.1/24`}},
		{"tun IPv6 exit address outside the prefix",
			relays + chain + tunTunnel(`tun: {address: "fd20::1/64", routes: ["fd77::/64"], mode: packet, exitAddress: "fd21::2/64"}`),
			[]string{`spec.tun.exitAddress: fd21::2/64 must be another address in the prefix of spec.tun.address (fd20::/64)`}},
		{"tun IPv6 exit address of the other family",
			relays + chain + tunTunnel(`tun: {address: "fd20::1/64", routes: ["fd77::/64"], mode: packet, exitAddress: 10.200.0.2/24}`),
			[]string{`spec.tun.exitAddress: 10.200.0.2/24 must be another address in the prefix of spec.tun.address (fd20::/64)`}},
		{"tun IPv6 address at the end of its prefix",
			relays + chain + tunTunnel(`tun: {address: "fd20::ffff:ffff:ffff:ffff/64", routes: ["fd77::/64"], mode: packet}`),
			[]string{`spec.tun.exitAddress: fd20::ffff:ffff:ffff:ffff/64 leaves no next address in its prefix for the exit`}},
		{"tun IPv6 sources",
			relays + chain + tunTunnel(`tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16, "fd77::/64"], mode: packet, sources: [10.200.0.0/24, "fd30::1/64", "fd31::/129"]}`),
			[]string{`spec.tun.sources[1]: "fd30::1/64" has host bits set; write fd30::/64`, `spec.tun.sources[2]: "fd31::/129" is not a prefix`}},
		{"tun exit address outside the prefix",
			relays + chain + tunTunnel("tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16], mode: packet, exitAddress: 10.9.0.2/24}"),
			[]string{`spec.tun.exitAddress: 10.9.0.2/24 must be another address in the prefix of spec.tun.address (10.200.0.0/24)`}},
		{"tun flow mode with packet fields",
			relays + chain + tunTunnel("tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16], sources: [10.0.0.0/8]}"),
			[]string{`spec.tun: exitAddress and sources apply to mode packet only`}},
		{"two devices of one name on one relay",
			relays + chain + tunTunnel("tun: {name: hl0, address: 10.200.0.1/24, routes: [10.77.0.0/16]}") +
				strings.Replace(tunTunnel("tun: {name: hl0, address: 10.201.0.1/24, routes: [10.78.0.0/16]}"), "name: sub", "name: sub2", 1),
			[]string{`Tunnel "default/sub2": spec.tun.name: device "hl0" is Tunnel "default/sub"'s on entry relay "hk"`}},
		{"unknown field",
			relays + strings.Replace(chain, "entry: hk", "entyr: hk, entry: hk", 1),
			[]string{`Chain "to-east": unknown field "spec.entyr"; did you mean "spec.entry"?`}},
		{"unknown field, nothing near",
			relays + strings.Replace(chain, "entry: hk", "colour: blue, entry: hk", 1),
			[]string{`Chain "to-east": unknown field "spec.colour"`}},
		{"unknown nested field",
			relays + chain + strings.Replace(tunnel, "port: 15202", "prot: 15202", 1),
			[]string{`unknown field "spec.listen.prot"; did you mean "spec.listen.port"?`}},
		{"duration names its field",
			relays + strings.Replace(routed, "maxHops: 4", "maxHops: 4, probe: {interval: 5x}", 1),
			[]string{`Chain "fast": spec.probe.interval: "5x" is not a duration; use a number with a unit, such as 500ms, 2s or 1m`}},
		{"quantity names its field",
			strings.Replace(relays, "endpoints: [\"127.0.0.1:7401\"]", "endpoints: [\"127.0.0.1:7401\"], resources: {requests: {cpu: lots}}", 1),
			[]string{`RelayNode "hk": spec.resources.requests.cpu: "lots" is not a quantity`}},
		{"relay port written as zero",
			strings.Replace(relays, "port: 7401", "port: 0", 1),
			[]string{`RelayNode "hk": spec.listen.port: 0 is out of range; use 1-65535, or leave it out for 7401`}},
		{"yaml error names the line of the file",
			"apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: a}\n---\nmetadata:\n  name: b\n   bad: indent\n",
			[]string{`bad.yaml (document 2): not valid YAML: yaml: line 7: mapping values are not allowed`}},
		{"a tab that indents says tab",
			"apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: a}\n---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata:\n\tname: b\n",
			[]string{`bad.yaml (document 2): not valid YAML: yaml: line 8: found character that cannot start any token; line 8 is indented with a tab: YAML indents with spaces only, so replace the tab with spaces`}},
		{"a tab after spaces says tab",
			"apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: a}\nspec:\n  listen:\n    port: 7401\n  \tendpoints: []\n",
			[]string{`line 7 is indented with a tab: YAML indents with spaces only, so replace the tab with spaces`}},
		{"hoplink kind without apiVersion",
			relays + "---\nkind: Chain\nmetadata: {name: x}\nspec: {entry: hk, exit: la, route: [hk, la]}\n",
			[]string{`Chain "x": apiVersion "": a Chain is hoplink.dev/v1alpha1; set apiVersion: hoplink.dev/v1alpha1`}},
		{"hoplink kind under another group",
			relays + "---\napiVersion: hoplink.io/v1alpha1\nkind: Tunnel\nmetadata: {name: x}\nspec: {}\n",
			[]string{`Tunnel "x": apiVersion "hoplink.io/v1alpha1": a Tunnel is hoplink.dev/v1alpha1`}},
		{"wrong type",
			strings.Replace(relays, "port: 7401", `port: "x"`, 1),
			[]string{`RelayNode "hk": spec.listen.port: got a string, want int32`}},
		{"wrong version",
			strings.Replace(relays, "hoplink.dev/v1alpha1", "hoplink.dev/v1", 1),
			[]string{`apiVersion "hoplink.dev/v1" is not served; use hoplink.dev/v1alpha1`}},
		{"unknown kind",
			relays + "---\napiVersion: hoplink.dev/v1alpha1\nkind: Route\nmetadata: {name: x}\n",
			[]string{`kind "Route" is not a hoplink.dev kind`}},
		{"duplicate relay",
			relays + "---" + strings.SplitN(relays, "---", 2)[0],
			[]string{`RelayNode "hk": metadata.name: defined again (first in bad.yaml)`}},
		{"bad relay name",
			strings.Replace(relays, "name: hk", "name: Hong_Kong", 1),
			[]string{`RelayNode "Hong_Kong": metadata.name:`}},
		{"routed chain: relay without endpoints",
			strings.Replace(relays, `endpoints: ["127.0.0.1:7402"]`, ``, 1) + routed,
			[]string{`RelayNode "seattle": spec.endpoints: required: relay "seattle" may carry flows of sum Chain "default/fast"`}},
		{"routed chain: route longer than maxHops",
			relays + strings.Replace(routed, "maxHops: 4", "maxHops: 1, route: [hk, seattle, la]", 1),
			[]string{`Chain "default/fast": spec.route: 2 links, more than spec.maxHops (1) allows`}},
		{"routed chain: fields out of range",
			relays + strings.Replace(routed, "maxHops: 4", "maxHops: 20, probe: {interval: 10ms, candidates: 9}, hysteresis: {percent: 101, rounds: 0, min: 2m}", 1),
			[]string{`spec.maxHops: 20 is out of range; use 1-15`, `spec.probe.interval: 10ms is out of range; use 100ms to 10m`,
				`spec.probe.candidates: 9 is out of range; use 1-8`, `spec.hysteresis.percent: 101 is out of range`,
				`spec.hysteresis.min: 2m0s is out of range`}},
		{"routed chain: entry is exit",
			relays + strings.Replace(routed, "exit: la", "exit: hk", 1),
			[]string{`Chain "default/fast": spec.exit: "hk" is also the entry; a sum chain routes between two relays`}},
		{"several errors at once",
			strings.Replace(relays, "port: 7401", "port: -1", 1) + strings.Replace(chain, "exit: la", "exit: ny", 1),
			[]string{`spec.listen.port: -1`, `spec.exit: unknown RelayNode "ny"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "1-relays.yaml"), []byte(relays), 0o644)
	os.WriteFile(filepath.Join(dir, "2-chain.yml"), []byte(chain+tunnel), 0o644)
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a manifest"), 0o644)
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Relays) != 3 || len(s.Tunnels) != 1 {
		t.Fatalf("loaded %d relays, %d tunnels", len(s.Relays), len(s.Tunnels))
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing path accepted")
	}
	empty := t.TempDir()
	if _, err := Load(empty); err == nil || !strings.Contains(err.Error(), "holds no .yaml") {
		t.Fatalf("empty dir: %v", err)
	}
}

func TestCheckSingleHost(t *testing.T) {
	s, err := Parse("x.yaml", []byte(strings.Replace(relays, "port: 7402", "port: 7401", 1)))
	if err != nil {
		t.Fatal(err) // two hosts may share a port
	}
	err = s.CheckSingleHost()
	if err == nil || !strings.Contains(err.Error(), `RelayNode "seattle": spec.listen: udp :7401 collides with RelayNode "hk"`) {
		t.Fatalf("CheckSingleHost = %v", err)
	}
}

func TestAllowsHop(t *testing.T) {
	s, err := Parse("x.yaml", []byte(relays+chain))
	if err != nil {
		t.Fatal(err)
	}
	c := s.Chains[0]
	for _, tc := range []struct {
		prev, self string
		rest       []string
		ok         bool
	}{
		{"", "hk", []string{"hk", "seattle", "la"}, true},
		{"hk", "seattle", []string{"seattle", "la"}, true},
		{"seattle", "la", []string{"la"}, true},
		{"hk", "la", []string{"la"}, false},                      // skipped a hop
		{"seattle", "seattle", []string{"seattle", "la"}, false}, // wrong previous hop
		{"hk", "seattle", []string{"seattle"}, false},            // does not end at exit
		{"hk", "seattle", []string{"la", "seattle"}, false},
		{"hk", "seattle", nil, false},
	} {
		if got := AllowsHop(c, tc.prev, tc.self, tc.rest); got != tc.ok {
			t.Errorf("AllowsHop(%q, %q, %v) = %v, want %v", tc.prev, tc.self, tc.rest, got, tc.ok)
		}
	}
}

// TestStatusRouteSteersOnlyWhatTheSpecAllows: whoever may write a Chain's
// status (or forge it in a relay's cache) cannot move a static chain's
// flows, nor a routed chain's off the routes its spec allows.
func TestStatusRouteSteersOnlyWhatTheSpecAllows(t *testing.T) {
	s, err := Parse("x.yaml", []byte(relays+chain+routed))
	if err != nil {
		t.Fatal(err)
	}
	static, fast := s.Chain("default/to-east"), s.Chain("default/fast")
	static.Status.Route = []string{"hk", "la"}
	if got := Route(static); strings.Join(got, ",") != "hk,seattle,la" {
		t.Errorf("static chain follows its status: %v", got)
	}
	if AllowsHop(static, "hk", "la", []string{"la"}) {
		t.Error("a static chain admits the route in its status")
	}
	fast.Status.Route = []string{"hk", "mallory", "la"}
	if got := Route(fast); len(got) != 0 {
		t.Errorf("routed chain follows a route its spec does not allow: %v", got)
	}
	fast.Status.Route = []string{"hk", "seattle", "la"}
	if got := Route(fast); strings.Join(got, ",") != "hk,seattle,la" {
		t.Errorf("routed chain ignores its controller: %v", got)
	}
}

func TestRoutedChain(t *testing.T) {
	s, err := Parse("x.yaml", []byte(relays+routed))
	if err != nil {
		t.Fatal(err)
	}
	c := s.Chain("default/fast")
	if c.Spec.Probe.Interval.Duration != 2*time.Second || c.Spec.Probe.Candidates != 3 || *c.Spec.Hysteresis.Percent != 5 ||
		c.Spec.Hysteresis.Min.Duration != 2*time.Millisecond || c.Spec.Hysteresis.Rounds != 2 {
		t.Errorf("defaults: probe %+v hysteresis %+v", c.Spec.Probe, c.Spec.Hysteresis)
	}
	// Every relay a route may continue to is a next hop, so links to them
	// are kept up and probed.
	for relay, want := range map[string]string{"hk": "seattle,la", "seattle": "la", "la": ""} {
		if got := strings.Join(s.NextHops(relay), ","); got != want {
			t.Errorf("NextHops(%s) = %s, want %s", relay, got, want)
		}
	}
	// A routed chain allows every route its spec does, from the right
	// previous hop, so that flows on a replaced route still finish.
	for _, tc := range []struct {
		prev, self string
		rest       []string
		ok         bool
	}{
		{"", "hk", []string{"hk", "la"}, true},
		{"", "hk", []string{"hk", "seattle", "la"}, true},
		{"hk", "seattle", []string{"seattle", "la"}, true},
		{"hk", "la", []string{"la"}, true},
		{"seattle", "la", []string{"la"}, true},
		{"", "seattle", []string{"seattle", "la"}, false},         // only the entry starts a flow
		{"la", "seattle", []string{"seattle", "la"}, false},       // the exit forwards nothing
		{"hk", "seattle", []string{"seattle", "hk", "la"}, false}, // back through the entry
		{"hk", "seattle", []string{"seattle"}, false},             // does not reach the exit
		{"seattle", "seattle", []string{"seattle", "la"}, false},
	} {
		if got := AllowsHop(c, tc.prev, tc.self, tc.rest); got != tc.ok {
			t.Errorf("AllowsHop(%q, %q, %v) = %v, want %v", tc.prev, tc.self, tc.rest, got, tc.ok)
		}
	}
	// Link requests may end at any relay a route may cross.
	for _, tc := range []struct {
		prev, self string
		rest       []string
		ok         bool
	}{
		{"hk", "seattle", []string{"seattle"}, true},
		{"hk", "seattle", []string{"seattle", "la"}, true},
		{"seattle", "la", []string{"la"}, true},
		{"hk", "hk", []string{"hk"}, false},
		{"la", "seattle", []string{"seattle"}, false},       // from the exit
		{"hk", "la", []string{"la", "seattle"}, false},      // past the exit
		{"hk", "seattle", []string{"seattle", "hk"}, false}, // back to the entry
		{"mallory", "seattle", []string{"seattle"}, false},
	} {
		if got := AllowsPath(c, tc.prev, tc.self, tc.rest); got != tc.ok {
			t.Errorf("AllowsPath(%q, %q, %v) = %v, want %v", tc.prev, tc.self, tc.rest, got, tc.ok)
		}
	}
	c.Spec.MaxHops = 1
	if AllowsHop(c, "hk", "seattle", []string{"seattle", "la"}) || !AllowsHop(c, "hk", "la", []string{"la"}) {
		t.Error("maxHops 1 must allow entry -> exit only")
	}
	for _, r := range [][]string{{"hk", "seattle", "la"}, {"la"}, {"hk"}, {"hk", "la", "la"}} {
		if ValidRoute(c, r) == nil {
			t.Errorf("ValidRoute(%v) with maxHops 1 accepted it", r)
		}
	}
}

func TestTunTunnel(t *testing.T) {
	s, err := Parse("x.yaml", []byte(relays+chain+tunTunnel("tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}")))
	if err != nil {
		t.Fatal(err)
	}
	u := s.Tunnel("default/sub").Spec.TUN
	if u.Name != "hl-sub" || u.MTU != 1420 || u.Mode != "flow" {
		t.Errorf("defaults: %+v", u)
	}
	// IPv6 alone, and both families on one device, at IPv6's least MTU.
	for _, tun := range []string{
		`tun: {address: "fd20::1/64", mtu: 1280, routes: ["fd77::/64", "2001:db8::/32"]}`,
		`tun: {address: "fd20::1/64", routes: ["fd77::/64"], mode: packet, exitAddress: "fd20::9/64", sources: ["fd20::/64", "fd30::/48"]}`,
		`tun: {address: 10.200.0.1/24, mtu: 1280, routes: [10.77.0.0/16, "fd77::/64"], mode: packet, sources: [10.200.0.0/24, "fd30::/64"]}`,
	} {
		if _, err := Parse("x.yaml", []byte(relays+chain+tunTunnel(tun))); err != nil {
			t.Errorf("%s: %v", tun, err)
		}
	}
	// One host cannot hold both ends of a packet-mode Tunnel.
	s, err = Parse("x.yaml", []byte(relays+chain+tunTunnel("tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16], mode: packet}")))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSingleHost(); err == nil || !strings.Contains(err.Error(), "packet mode joins two hosts' networks") {
		t.Errorf("CheckSingleHost = %v", err)
	}
}

// The examples the README points at must load: a renamed field would
// otherwise break them unnoticed.
func TestExamplesLoad(t *testing.T) {
	for _, dir := range []string{"../examples/local", "../examples/tun"} {
		s, err := Load(dir)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		if len(s.Tunnels) == 0 {
			t.Errorf("%s: no Tunnels", dir)
		}
	}
}
