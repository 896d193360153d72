package observe

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
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
