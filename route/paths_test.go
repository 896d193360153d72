package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// exhaustive is how Candidates chose before it stopped listing every route
// (kept verbatim as the oracle): every simple route, sorted, cut to k.
func exhaustive(g *Graph, req Request, k int) []Path {
	maxHops := req.MaxHops
	if maxHops <= 0 {
		maxHops = DefaultMaxHops
	}
	if k <= 0 || g.down[req.Entry] || g.down[req.Exit] {
		return nil
	}
	if req.Entry == req.Exit {
		c := g.target[req.Exit]
		return []Path{{Relays: []string{req.Entry}, Cost: c, Estimated: c}}
	}
	var out []Path
	path := []string{req.Entry}
	var walk func(at string, cost time.Duration)
	walk = func(at string, cost time.Duration) {
		if rtt, ok := g.Link(at, req.Exit); ok {
			c := cost + rtt + g.target[req.Exit]
			out = append(out, Path{Relays: append(slices.Clone(path), req.Exit), Cost: c, Estimated: c})
		}
		if len(path) >= maxHops { // one more link would reach only the exit
			return
		}
		for _, v := range req.Via {
			if v == req.Entry || v == req.Exit || g.down[v] || slices.Contains(path, v) {
				continue
			}
			rtt, ok := g.Link(at, v)
			if !ok {
				continue
			}
			path = append(path, v)
			walk(v, cost+rtt)
			path = path[:len(path)-1]
		}
	}
	walk(req.Entry, 0)
	slices.SortFunc(out, Path.compare)
	if len(out) > k {
		out = out[:k]
	}
	return out
}

// names are what random graphs call their relays: not in the order they
// are listed in, some a prefix of another, so that numbering by name and
// breaking ties by name are both put to the test.
var names = []string{"m", "c", "x", "a", "ab", "b", "k", "z", "d", "ka"}

// randomCase draws a small network from r: up to 8 relays besides the
// entry and exit, links present or missing at random, RTTs from a handful
// of values (so that many routes tie), sometimes a relay down, a link to a
// relay the chain may not use, and any hop limit from the default to more
// links than relays.
func randomCase(r *rand.Rand) (*Graph, Request, int) {
	pool := slices.Clone(names)
	r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	nvia := r.IntN(len(pool) - 2)
	req := Request{Entry: pool[0], Exit: pool[1], Via: pool[2 : 2+nvia], MaxHops: r.IntN(10)}
	all := pool[:min(len(pool), 3+nvia)] // one relay beyond the chain's
	g := &Graph{}
	density := 0.2 + 0.8*r.Float64()
	rtts := []time.Duration{0, ms, ms, 2 * ms, 3 * ms, 5 * ms, 1500 * time.Microsecond}
	for _, a := range all {
		for _, b := range all {
			if r.Float64() < density {
				g.SetLink(a, b, rtts[r.IntN(len(rtts))])
			}
		}
	}
	if r.IntN(4) == 0 && len(all) > 2 {
		g.SetDown(all[2+r.IntN(len(all)-2)], true)
	}
	if r.IntN(3) == 0 {
		g.SetTarget(req.Exit, time.Duration(r.IntN(4))*ms)
	}
	return g, req, 1 + r.IntN(12)
}

func describe(g *Graph, req Request, k int) string {
	var links []string
	for l, rtt := range g.links {
		links = append(links, fmt.Sprintf("%s>%s=%v", l[0], l[1], rtt))
	}
	slices.Sort(links)
	return fmt.Sprintf("req %+v k %d down %v target %v links %v", req, k, g.down, g.target, links)
}

func samePaths(a, b []Path) bool {
	return slices.EqualFunc(a, b, func(p, q Path) bool {
		return slices.Equal(p.Relays, q.Relays) && p.Cost == q.Cost && p.Estimated == q.Estimated && p.Measured == q.Measured
	})
}

// Candidates gives exactly the routes the exhaustive search gave, in the
// same order and with the same figures, on random small networks full of
// ties.
func TestCandidatesAgreeWithExhaustive(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 4))
	for i := range 4000 {
		g, req, k := randomCase(r)
		want, got := exhaustive(g, req, k), Candidates(g, req, k)
		if !samePaths(got, want) {
			t.Fatalf("case %d: %s\ngot  %s\nwant %s", i, describe(g, req, k), routes(got), routes(want))
		}
	}
}

// FuzzCandidates compares Candidates with the exhaustive search on
// networks the fuzzer draws.
func FuzzCandidates(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(31), uint64(4))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		g, req, k := randomCase(rand.New(rand.NewPCG(a, b)))
		want, got := exhaustive(g, req, k), Candidates(g, req, k)
		if !samePaths(got, want) {
			t.Fatalf("%s\ngot  %s\nwant %s", describe(g, req, k), routes(got), routes(want))
		}
	})
}

// A link reported below zero counts as zero: otherwise a loop through it
// would be cheaper than no loop, and the cheapest route would cross a
// relay twice.
func TestNegativeRTTCountsAsZero(t *testing.T) {
	g := &Graph{}
	g.SetLink("hk", "la", 10*ms)
	g.SetLink("la", "seattle", -50*ms)
	g.SetLink("seattle", "la", -50*ms)
	g.SetLink("la", "useast", 10*ms)
	g.SetLink("seattle", "useast", 30*ms)
	if rtt, _ := g.Link("la", "seattle"); rtt != 0 {
		t.Errorf("link measured at -50ms kept as %v", rtt)
	}
	req := Request{Entry: "hk", Exit: "useast", Via: []string{"la", "seattle"}, MaxHops: 8}
	if got, want := routes(Candidates(g, req, 3)), "hk,la,useast=20ms hk,la,seattle,useast=40ms"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
