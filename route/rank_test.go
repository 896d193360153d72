package route

import (
	"strings"
	"testing"
	"time"
)

func TestToMeasure(t *testing.T) {
	cands := []Path{path(10*ms, "hk", "la", "useast"), path(12*ms, "hk", "useast")}
	cur := []string{"hk", "seattle", "la", "useast"}
	for _, tc := range []struct {
		mode    Mode
		current []string
		want    string
	}{
		{Sum, cur, "hk,la,useast hk,seattle,la,useast"},
		{Sum, nil, "hk,la,useast"},
		{Pipe, cur, "hk,la,useast hk,useast hk,seattle,la,useast"},
		{Pipe, []string{"hk", "useast"}, "hk,la,useast hk,useast"},
	} {
		var got []string
		for _, r := range ToMeasure(tc.mode, cands, tc.current) {
			got = append(got, Key(r))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("mode %d, current %v: %v, want %s", tc.mode, tc.current, got, tc.want)
		}
	}
}

// In pipe mode the measurements decide: here the summed links favour the
// route through la, but a slow relay there makes it the worse one end to
// end, which per-link sums cannot see.
func TestRankPipeCatchesWhatSumsMiss(t *testing.T) {
	g := seed004()
	g.SetTarget("useast", 2*ms)
	req := Request{Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}}
	cands := Candidates(g, req, 3) // hk,seattle,useast=229 hk,la,useast=236 hk,seattle,la,useast=255
	measured := map[string]time.Duration{
		"hk,seattle,useast":    280 * ms, // a queue at seattle the links do not show
		"hk,la,useast":         237 * ms,
		"hk,seattle,la,useast": 0, // absent below: the probe failed
	}
	delete(measured, "hk,seattle,la,useast")
	current := []string{"hk", "seattle", "useast"}

	ranked, cost, ok := Rank(Pipe, g, cands, measured, current)
	if got := routes(ranked); got != "hk,la,useast=239ms hk,seattle,useast=282ms" {
		t.Errorf("pipe ranking %s", got)
	}
	if !ok || cost != 282*ms {
		t.Errorf("current route priced %v %v, want 282ms (measured + target)", cost, ok)
	}
	if ranked[0].Estimated != 236*ms || ranked[0].Measured != 239*ms {
		t.Errorf("figures kept: %+v", ranked[0])
	}

	ranked, cost, ok = Rank(Sum, g, cands, measured, current)
	if got := routes(ranked); got != "hk,seattle,useast=229ms hk,la,useast=236ms hk,seattle,la,useast=255ms" {
		t.Errorf("sum ranking %s", got)
	}
	if !ok || cost != 229*ms || ranked[0].Measured != 282*ms {
		t.Errorf("sum mode: current %v %v, measured %v", cost, ok, ranked[0].Measured)
	}

	// A current route whose end-to-end probe failed is broken in pipe mode.
	if _, _, ok := Rank(Pipe, g, cands, measured, []string{"hk", "seattle", "la", "useast"}); ok {
		t.Error("an unmeasured current route priced in pipe mode")
	}
	// A Selector fed the pipe ranking leaves the broken route at once.
	s := &Selector{H: DefaultHysteresis}
	s.Next([]Path{path(255*ms, "hk", "seattle", "la", "useast")}, 0, false)
	ranked, cost, ok = Rank(Pipe, g, cands, measured, s.Current())
	if d := s.Next(ranked, cost, ok); !d.Changed || Key(d.Route) != "hk,la,useast" {
		t.Errorf("decision %+v", d)
	}
}
