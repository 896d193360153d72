package manifest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// meshChains is n routed chains over relays r0..r(relays-1), each with an
// entry, two via relays and an exit drawn at random (seeded): the shape of
// issue 31's 1,000 relays and 10,000 chains.
func meshChains(relays, n int) []*v1alpha1.Chain {
	rng := rand.New(rand.NewPCG(31, 1))
	out := make([]*v1alpha1.Chain, 0, n)
	for i := range n {
		p := rng.Perm(relays)[:4]
		name := func(j int) string { return fmt.Sprintf("r%d", p[j]) }
		c := &v1alpha1.Chain{Spec: v1alpha1.ChainSpec{Entry: name(0), Via: []string{name(1), name(2)}, Exit: name(3), Mode: v1alpha1.ModeSum, MaxHops: 3}}
		c.Name = fmt.Sprintf("c%d", i)
		out = append(out, c)
	}
	return out
}

// A relay keeps links only to the relays its own chains may route to, and
// its view (the chains it is a member of, issue 31) gives it the same
// links as the whole namespace would: no link depends on a chain it is
// not in, so links and probes grow with a relay's chains, not the mesh.
func TestLinksGrowWithARelaysChains(t *testing.T) {
	const relays = 200
	chains := meshChains(relays, 2000)
	all := &Set{Chains: chains}
	for r := range relays {
		name := fmt.Sprintf("r%d", r)
		view := &Set{}
		allowed := map[string]bool{}
		for _, c := range chains {
			if m := Members(c); slices.Contains(m, name) {
				view.Chains = append(view.Chains, c)
				for _, x := range m {
					allowed[x] = true
				}
			}
		}
		got, want := view.NextHops(name), all.NextHops(name)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: links from its view %v, from the whole namespace %v", name, got, want)
		}
		for _, p := range got {
			if !allowed[p] {
				t.Fatalf("%s links to %s, which no chain of its own has", name, p)
			}
		}
	}
}

// BenchmarkLinksPerRelay reports, at 1,000 relays and 10,000 chains, how
// many peers a relay keeps links to (and probes): their most and mean,
// against the 999 of a full mesh.
func BenchmarkLinksPerRelay(b *testing.B) {
	const relays = 1000
	chains := meshChains(relays, 10000)
	byRelay := map[string]*Set{}
	for _, c := range chains {
		for _, m := range Members(c) {
			if byRelay[m] == nil {
				byRelay[m] = &Set{}
			}
			byRelay[m].Chains = append(byRelay[m].Chains, c)
		}
	}
	var most, sum, chainsMost int
	for b.Loop() {
		most, sum, chainsMost = 0, 0, 0
		for name, view := range byRelay {
			n := len(view.NextHops(name))
			most, sum = max(most, n), sum+n
			chainsMost = max(chainsMost, len(view.Chains))
		}
	}
	b.ReportMetric(float64(most), "links-most")
	b.ReportMetric(float64(sum)/float64(len(byRelay)), "links-mean")
	b.ReportMetric(float64(chainsMost), "chains-most")
}
