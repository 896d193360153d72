package route

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// meshRound is what a round computes from for a chain through via relays
// that all have links to each other, as in local mode or a small cluster:
// every relay's table (its links up, with RTTs from 1 to 200 ms) and the
// request.
func meshRound(via int) (req Request, links [][3]any) {
	r := rand.New(rand.NewPCG(uint64(via), 31))
	req = Request{Entry: "entry", Exit: "exit"}
	for i := range via {
		req.Via = append(req.Via, fmt.Sprintf("via-%03d", i))
	}
	all := append([]string{req.Entry, req.Exit}, req.Via...)
	for _, a := range all {
		for _, b := range all {
			if a != b {
				links = append(links, [3]any{a, b, time.Millisecond + time.Duration(r.IntN(199_000))*time.Microsecond})
			}
		}
	}
	return req, links
}

// exhaustivePaths is how many routes the exhaustive search lists through
// via relays that all link to each other: one per ordered choice of up to
// maxHops-1 of them.
func exhaustivePaths(via, maxHops int) float64 {
	n, term := 1.0, 1.0
	for j := 0; j < maxHops-1 && j < via; j++ {
		term *= float64(via - j)
		n += term
	}
	return n
}

// BenchmarkRound times the computing part of a sum-mode round, from the
// relays' tables to the ranked candidates (k = 8, the most probe.candidates
// allows): the exhaustive search the round used to run beside Candidates.
// The exhaustive search runs only where it lists at most maxExhaustive
// routes; past that it takes seconds to forever and gigabytes.
//
//	go test ./route -run '^$' -bench Round -benchmem
func BenchmarkRound(b *testing.B) {
	const k, maxExhaustive = 8, 300_000
	for _, via := range []int{8, 32, 64, 128} {
		req, links := meshRound(via)
		for _, maxHops := range []int{4, 8} {
			req.MaxHops = maxHops
			for _, alg := range []struct {
				name string
				f    func(*Graph, Request, int) []Path
			}{{"exhaustive", exhaustive}, {"yen", Candidates}} {
				b.Run(fmt.Sprintf("via=%d/maxHops=%d/%s", via, maxHops, alg.name), func(b *testing.B) {
					if n := exhaustivePaths(via, maxHops); alg.name == "exhaustive" && n > maxExhaustive {
						// skip-ok: a size the exhaustive search is not run at, by design.
						b.Skipf("%.3g routes to list", n)
					}
					for b.Loop() {
						g := &Graph{}
						for _, l := range links {
							g.SetLink(l[0].(string), l[1].(string), l[2].(time.Duration))
						}
						cands := alg.f(g, req, k)
						if len(cands) != k {
							b.Fatalf("%d candidates", len(cands))
						}
						Rank(Sum, g, cands, nil, cands[k-1].Relays)
					}
				})
			}
		}
	}
}
