package observe

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/measure"
)

// A routed chain kept on its route over a cheaper candidate says so in
// REASON, instead of what chose the route first; otherwise REASON is the
// last change's.
func TestReportSaysWhyARouteIsKept(t *testing.T) {
	now := time.Now()
	kept := "kept: candidate hk,la is 400µs cheaper, below the 2ms / 5% switch threshold"
	r := &Report{Time: now, Ready: true, Relays: []Relay{{Name: "hk", Endpoint: "127.0.0.1:7401", Status: &adminapi.Status{
		Relay: "hk", Ready: true,
		Chains: []adminapi.ChainRoute{
			{Chain: "default/fastest", Mode: "sum", Route: []string{"hk", "seattle", "la"}, Reason: "first route", Kept: kept, Changed: now.Add(-time.Minute)},
			{Chain: "default/other", Mode: "pipe", Route: []string{"hk", "la"}, Reason: "first route", Changed: now.Add(-time.Minute)},
		},
	}}}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	if l := lines["default/fastest"]; !strings.HasSuffix(l, "  "+kept) {
		t.Errorf("kept chain: %q, want REASON %q\n%s", l, kept, b.String())
	}
	if l := lines["default/other"]; !strings.HasSuffix(l, "  first route") {
		t.Errorf("chain on the cheapest route: %q, want REASON first route\n%s", l, b.String())
	}
}

// A link long enough that one TLS flow is bound by the relay's send buffer
// gets a note with the bound and what to raise; a short one does not.
func TestReportSaysWhenTheSendBufferBindsAFlow(t *testing.T) {
	ms := func(n int) measure.Duration { return measure.Duration(time.Duration(n) * time.Millisecond) }
	r := &Report{Time: time.Now(), Relays: []Relay{{Name: "hk", Status: &adminapi.Status{
		Relay:      "hk",
		Congestion: &adminapi.Congestion{Want: "auto", Algorithm: "bbr", Reason: "auto", SendBuffer: 4 << 20},
		Peers:      []adminapi.Peer{{Name: "useast", Up: true, RTT: ms(300)}, {Name: "seattle", Up: true, RTT: ms(20)}},
	}}}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "hk -> useast: one TLS flow carries at most 56 Mbit/s at this link's 300ms round trip") ||
		!strings.Contains(out, `net.ipv4.tcp_wmem="4096 16384 33554432"`) {
		t.Errorf("no note for the 300 ms link, or not the bound and the fix:\n%s", out)
	}
	if strings.Contains(out, "hk -> seattle: one TLS flow") {
		t.Errorf("a note for the 20 ms link, which 4 MiB fills at 800 Mbit/s:\n%s", out)
	}
}

// An imported service's port shows its clusterset IP, the cluster it goes
// to, and the Tunnel, Chain and route its flows take.
func TestReportListsImports(t *testing.T) {
	r := &Report{Time: time.Now(), Ready: true, Imports: []Import{{Service: "demo/web", Type: "ClusterSetIP", IPs: []string{"10.96.187.228"},
		Port: "TCP/8080", Cluster: "a", Tunnel: "mcs-0123456789abcdef0123", Chain: "mcs-b-a-1a2b3c4d", Route: []string{"east2", "hk"}, Ready: "True"}}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "demo/web") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) != 10 || f[1] != "10.96.187.228" || f[3] != "a" || f[6] != "east2" || f[8] != "hk" || f[9] != "True" {
		t.Errorf("import row %q\n%s", row, b.String())
	}
}

// TestProbeTableOfADeadLink: a hop that did not answer shows no loss
// figure (its probes' count would be a made-up one), a target that
// refused shows why, and Failures lists both.
func TestProbeTableOfADeadLink(t *testing.T) {
	p := &Probe{Chain: "default/c", Mode: "sum", Route: []string{"hk", "m", "la"},
		Hops:    []Hop{{From: "hk", To: "m", Loss: 0.25, Err: "no answer to this round's probes"}, {From: "m", To: "la", Loss: 0.004}},
		Targets: []measure.Target{{Tunnel: "default/t", Target: "10.0.0.9:80", Error: "dial tcp 10.0.0.9:80: connect: connection refused"}}}
	var b strings.Builder
	if err := WriteProbe(&b, p); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "25.0%") || !strings.Contains(out, "0.4%") || !strings.Contains(out, "connection refused") {
		t.Errorf("probe table:\n%s", out)
	}
	if f := p.Failures(); len(f) != 2 || !strings.HasPrefix(f[0], "link hk -> m: no answer") || !strings.HasPrefix(f[1], "target 10.0.0.9:80 of tunnel default/t: dial tcp") {
		t.Errorf("failures: %q", f)
	}
}

// A Tunnel's limits stand in its entry's row; a Tunnel without says "-".
func TestReportShowsTunnelLimits(t *testing.T) {
	r := &Report{Time: time.Now(), Relays: []Relay{{Name: "hk", Status: &adminapi.Status{
		Relay: "hk",
		Entries: []adminapi.Entry{
			{Tunnel: "default/held", Listen: "127.0.0.1:8080", Open: true, Flows: 3, Limits: "20 Mbit/s, 100 flows"},
			{Tunnel: "default/free", Listen: "127.0.0.1:8081", Open: true},
		},
	}}}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`FLOWS\s+LIMITS\s+ERROR`, `default/held\s+hk\s+127\.0\.0\.1:8080\s+yes\s+3\s+20 Mbit/s, 100 flows\s+-`, `default/free\s+hk\s+127\.0\.0\.1:8081\s+yes\s+0\s+-\s+-`} {
		if !regexp.MustCompile(want).MatchString(b.String()) {
			t.Errorf("no match for %s:\n%s", want, b.String())
		}
	}
}

// The LINK table says which IP family each link runs on, and a dash for a
// link that is down (no connection, no family).
func TestReportSaysTheLinksFamily(t *testing.T) {
	r := &Report{Time: time.Now(), Relays: []Relay{{Name: "hk", Status: &adminapi.Status{
		Relay: "hk",
		Peers: []adminapi.Peer{{Name: "seattle", Up: true, Family: "ipv6"}, {Name: "la", Up: true, Family: "ipv4"}, {Name: "useast"}},
	}}}}
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	var header []string
	for _, l := range strings.Split(b.String(), "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
		if f[0] == "LINK" {
			header = f
		}
		rows[f[0]] = f
	}
	col := -1
	for i, h := range header {
		if h == "FAMILY" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("no FAMILY column:\n%s", b.String())
	}
	for link, want := range map[string]string{"hk -> seattle": "ipv6", "hk -> la": "ipv4", "hk -> useast": "-"} {
		if r := rows[link]; len(r) <= col || r[col] != want {
			t.Errorf("%s: %q, want FAMILY %s\n%s", link, r, want, b.String())
		}
	}
}

// hoplink probe's HOP table says which family each hop runs on.
func TestProbeSaysTheHopsFamily(t *testing.T) {
	var b bytes.Buffer
	if err := WriteProbe(&b, &Probe{Chain: "default/c", Mode: "sum", Route: []string{"hk", "seattle", "la"},
		Hops: []Hop{{From: "hk", To: "seattle", Family: "ipv6"}, {From: "seattle", To: "la", Err: "no answer to this round's probes"}}}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []*regexp.Regexp{regexp.MustCompile(`(?m)^HOP\s+LINK\s+FAMILY\s+RTT`), regexp.MustCompile(`(?m)^1\s+hk -> seattle\s+ipv6\s`),
		regexp.MustCompile(`(?m)^2\s+seattle -> la\s+-\s`)} {
		if !want.MatchString(out) {
			t.Errorf("no line matching %s:\n%s", want, out)
		}
	}
}
