package observe

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/measure"
)

// TestRenderGraph: the map drawn by the Graphviz built in, as SVG,
// has every relay; a format it does not draw is refused with the choices.
func TestRenderGraph(t *testing.T) {
	r := &Report{Relays: []Relay{
		{Name: "hk", Status: &adminapi.Status{Relay: "hk", Ready: true, Peers: []adminapi.Peer{{Name: "la", Up: true, RTT: measure.Duration(2e6)}}}},
		{Name: "la", Err: "connection refused"},
	}}
	var svg bytes.Buffer
	if err := RenderGraph(context.Background(), &svg, r, "svg"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", ">hk</text>", ">la</text>", ">2ms 0.0%</text>"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("the SVG has no %q:\n%s", want, svg.String())
		}
	}
	if err := RenderGraph(context.Background(), io.Discard, r, "png"); err == nil || !strings.Contains(err.Error(), "[dot svg]") {
		t.Errorf("png: %v", err)
	}
}
