package route

import (
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

// seed004 is the topology of seed 004: Hong Kong to US-East, directly or
// through Seattle and Los Angeles.
func seed004() *Graph {
	g := &Graph{}
	g.SetLink("hk", "seattle", 152*ms)
	g.SetLink("seattle", "la", 32*ms)
	g.SetLink("la", "useast", 69*ms)
	g.SetLink("hk", "la", 165*ms)
	g.SetLink("seattle", "useast", 75*ms)
	g.SetLink("hk", "useast", 300*ms)
	return g
}

func routes(ps []Path) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String()+"="+p.Cost.String())
	}
	return strings.Join(s, " ")
}

func TestCandidates(t *testing.T) {
	req := Request{Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}}
	for _, tc := range []struct {
		name  string
		graph func() *Graph
		req   Request
		k     int
		want  string
	}{
		{"cheapest first", seed004, req, 10,
			"hk,seattle,useast=227ms hk,la,useast=234ms hk,seattle,la,useast=253ms hk,useast=300ms"},
		{"k bounds the list", seed004, req, 2, "hk,seattle,useast=227ms hk,la,useast=234ms"},
		{"maxHops 1 leaves the direct link", seed004, Request{Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}, MaxHops: 1}, 10, "hk,useast=300ms"},
		{"maxHops 2 drops the three-link route", seed004, Request{Entry: "hk", Exit: "useast", Via: []string{"seattle", "la"}, MaxHops: 2}, 10,
			"hk,seattle,useast=227ms hk,la,useast=234ms hk,useast=300ms"},
		{"only via relays", seed004, Request{Entry: "hk", Exit: "useast", Via: []string{"la"}}, 10, "hk,la,useast=234ms hk,useast=300ms"},
		{"a relay down", func() *Graph { g := seed004(); g.SetDown("seattle", true); return g }, req, 10, "hk,la,useast=234ms hk,useast=300ms"},
		{"exit down", func() *Graph { g := seed004(); g.SetDown("useast", true); return g }, req, 10, ""},
		{"unreachable exit", func() *Graph {
			g := &Graph{}
			g.SetLink("hk", "seattle", ms)
			return g
		}, req, 10, ""},
		{"target latency counts", func() *Graph { g := seed004(); g.SetTarget("useast", 5*ms); return g }, req, 1, "hk,seattle,useast=232ms"},
		{"ties: fewer hops, then by name", func() *Graph {
			g := &Graph{}
			g.SetLink("hk", "useast", 10*ms)
			g.SetLink("hk", "la", 5*ms)
			g.SetLink("la", "useast", 5*ms)
			g.SetLink("hk", "seattle", 5*ms)
			g.SetLink("seattle", "useast", 5*ms)
			return g
		}, req, 10, "hk,useast=10ms hk,la,useast=10ms hk,seattle,useast=10ms"},
		{"entry is exit", seed004, Request{Entry: "hk", Exit: "hk"}, 3, "hk=0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := routes(Candidates(tc.graph(), tc.req, tc.k)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestCost(t *testing.T) {
	g := seed004()
	if c, ok := g.Cost([]string{"hk", "seattle", "la", "useast"}); !ok || c != 253*ms {
		t.Errorf("cost %v %v", c, ok)
	}
	if _, ok := g.Cost([]string{"hk", "tokyo", "useast"}); ok {
		t.Error("a route over an unknown link has a cost")
	}
	g.SetDown("la", true)
	if _, ok := g.Cost([]string{"hk", "la", "useast"}); ok {
		t.Error("a route over a relay that is down has a cost")
	}
}

func path(cost time.Duration, relays ...string) Path { return Path{Relays: relays, Cost: cost} }

func TestSelectorHysteresis(t *testing.T) {
	s := &Selector{H: DefaultHysteresis}
	a := []string{"hk", "seattle", "useast"}
	b := []string{"hk", "la", "useast"}
	c := []string{"hk", "useast"}
	d := s.Next([]Path{path(100*ms, a...)}, 0, false)
	if !d.Changed || strings.Join(d.Route, ",") != "hk,seattle,useast" {
		t.Fatalf("first round: %+v", d)
	}
	steps := []struct {
		name    string
		cands   []Path
		current time.Duration
		ok      bool
		want    []string
		changed bool
	}{
		{"better by less than 5%", []Path{path(96*ms, b...)}, 100 * ms, true, a, false},
		{"better by less than 2 ms on a short route", []Path{path(19*ms, b...)}, 20 * ms, true, a, false},
		{"better by the margin, first round", []Path{path(90*ms, b...)}, 100 * ms, true, a, false},
		{"another challenger restarts the count", []Path{path(80*ms, c...)}, 100 * ms, true, a, false},
		{"the same challenger again: switch", []Path{path(80*ms, c...)}, 100 * ms, true, c, true},
		{"current is best", []Path{path(80*ms, c...), path(81*ms, a...)}, 80 * ms, true, c, false},
		{"one better round, then not", []Path{path(50*ms, a...)}, 80 * ms, true, c, false},
		{"not better", []Path{path(80*ms, a...)}, 80 * ms, true, c, false},
		{"streak broken, needs two rounds again", []Path{path(50*ms, a...)}, 80 * ms, true, c, false},
		{"current broken: switch at once", []Path{path(120*ms, b...)}, 0, false, b, true},
		{"no candidates: keep", nil, 0, false, b, false},
	}
	for _, st := range steps {
		d := s.Next(st.cands, st.current, st.ok)
		if strings.Join(d.Route, ",") != strings.Join(st.want, ",") || d.Changed != st.changed {
			t.Fatalf("%s: route %v changed %v (%s); want %v changed %v", st.name, d.Route, d.Changed, d.Reason, st.want, st.changed)
		}
		if d.Changed && d.Reason == "" {
			t.Errorf("%s: a change without a reason", st.name)
		}
	}
}

func TestMargin(t *testing.T) {
	h := DefaultHysteresis
	if m := h.Margin(10 * ms); m != 2*ms {
		t.Errorf("margin of 10 ms: %v, want the 2 ms floor", m)
	}
	if m := h.Margin(300 * ms); m != 15*ms {
		t.Errorf("margin of 300 ms: %v, want 5%%", m)
	}
}

func TestReach(t *testing.T) {
	g := &Graph{}
	g.SetLink("hk", "seattle", 50*ms)
	g.SetLink("hk", "tokyo", 10*ms)
	g.SetLink("tokyo", "la", 60*ms)
	g.SetLink("seattle", "la", 5*ms)
	g.SetLink("la", "useast", 5*ms)
	for _, tc := range []struct {
		to      string
		through []string
		want    string
	}{
		{"seattle", nil, "hk,seattle"},
		{"la", []string{"seattle", "tokyo"}, "hk,seattle,la"}, // two links either way: the cheaper
		{"la", []string{"tokyo"}, "hk,tokyo,la"},
		{"useast", []string{"seattle", "tokyo", "la"}, "hk,seattle,la,useast"},
		{"useast", []string{"seattle"}, ""}, // la may not be crossed
		{"moon", []string{"seattle", "tokyo", "la"}, ""},
	} {
		if got := Key(Reach(g, "hk", tc.to, tc.through)); got != tc.want {
			t.Errorf("Reach(hk, %s, %v) = %q, want %q", tc.to, tc.through, got, tc.want)
		}
	}
}

func TestSelectorStartDropChallenged(t *testing.T) {
	a := []string{"hk", "seattle", "useast"}
	b := []string{"hk", "la", "useast"}
	s := &Selector{H: DefaultHysteresis}
	// A route known from before is kept unless a better one wins twice.
	s.Start(a)
	if d := s.Next([]Path{path(90*ms, b...)}, 100*ms, true); d.Changed || s.Current() == nil || !s.Challenged() {
		t.Fatalf("started route replaced at the first round: %+v (challenged %v)", d, s.Challenged())
	}
	if d := s.Next([]Path{path(90*ms, b...)}, 100*ms, true); !d.Changed || Key(d.Route) != "hk,la,useast" || s.Challenged() {
		t.Fatalf("second round: %+v", d)
	}
	// A dropped route is replaced at once, for the reason given.
	s.Drop("the spec no longer allows it")
	if d := s.Next([]Path{path(100*ms, a...)}, 0, false); !d.Changed || d.Reason != "the spec no longer allows it" {
		t.Fatalf("after Drop: %+v", d)
	}
}

// A route kept while a cheaper candidate exists says why: the candidate
// wins by less than the margin, or has not won for enough rounds yet.
func TestSelectorSaysWhyItKeeps(t *testing.T) {
	a := []string{"hk", "seattle", "la"}
	b := []string{"hk", "la"}
	for _, tc := range []struct {
		name  string
		h     Hysteresis
		start []string
		cands []Path
		cost  time.Duration
		want  string
	}{
		{"below the floor", DefaultHysteresis, a, []Path{path(10*ms-400*time.Microsecond, b...), path(10*ms, a...)}, 10 * ms,
			"kept: candidate hk,la is 400µs cheaper, below the 2ms / 5% switch threshold"},
		{"below the percentage", Hysteresis{Fraction: 0.1, Min: 2 * ms, Rounds: 2}, a, []Path{path(290*ms, b...)}, 300 * ms,
			"kept: candidate hk,la is 10ms cheaper, below the 10% = 30ms switch threshold"},
		{"winning, not for long enough", DefaultHysteresis, a, []Path{path(20*ms, b...)}, 30 * ms,
			"kept: candidate hk,la is 10ms cheaper, beyond the 2ms / 5% switch threshold for 1 of the 2 rounds it must win"},
		{"current is the cheapest", DefaultHysteresis, a, []Path{path(10*ms, a...), path(11*ms, b...)}, 10 * ms, ""},
		{"an equal candidate first", DefaultHysteresis, a, []Path{path(10*ms, b...), path(10*ms, a...)}, 10 * ms, ""},
		{"first route", DefaultHysteresis, nil, []Path{path(10*ms, b...)}, 0, ""},
	} {
		s := &Selector{H: tc.h}
		s.Start(tc.start)
		d := s.Next(tc.cands, tc.cost, true)
		if d.Kept != tc.want {
			t.Errorf("%s: kept %q, want %q", tc.name, d.Kept, tc.want)
		}
	}
}
