// Package route chooses a Chain's path from measured latencies. It is pure
// computation, with no I/O and no clock of its own, so that local mode, the
// standalone relays and the operator run the same decisions, and tests can
// replay any sequence of measurements.
//
// Costs are round-trip times: a request and its answer cross every link of
// the path and the exit's link to the target once each way, so the latency
// a client sees is the sum of the links' RTTs plus the target's.
package route

import (
	"cmp"
	"slices"
	"time"
)

// DefaultMaxHops bounds the links of a route unless a Chain says otherwise.
const DefaultMaxHops = 4

// Graph holds what was last measured: the RTT of each directed link between
// relays, each exit's RTT to the targets it dials, and relays known down.
// The zero value is empty and ready to use.
type Graph struct {
	links  map[[2]string]time.Duration
	target map[string]time.Duration // by exit relay
	down   map[string]bool
}

// SetLink records the RTT measured on the link from one relay to another.
// An RTT below zero (only a broken or lying peer reports one) counts as
// zero: no link may make a route cheaper than its other links, or a route
// that returned to a relay could look cheapest.
func (g *Graph) SetLink(from, to string, rtt time.Duration) {
	if g.links == nil {
		g.links = map[[2]string]time.Duration{}
	}
	g.links[[2]string{from, to}] = max(rtt, 0)
}

// RemoveLink forgets a link (its peer is unreachable).
func (g *Graph) RemoveLink(from, to string) { delete(g.links, [2]string{from, to}) }

// SetTarget records an exit relay's RTT to its target.
func (g *Graph) SetTarget(exit string, rtt time.Duration) {
	if g.target == nil {
		g.target = map[string]time.Duration{}
	}
	g.target[exit] = rtt
}

// SetDown marks a relay down (or up again): no route may cross it.
func (g *Graph) SetDown(relay string, down bool) {
	if g.down == nil {
		g.down = map[string]bool{}
	}
	g.down[relay] = down
}

// Link returns a link's RTT and whether it is known.
func (g *Graph) Link(from, to string) (time.Duration, bool) {
	rtt, ok := g.links[[2]string{from, to}]
	return rtt, ok
}

// Path is a route with what it costs.
type Path struct {
	Relays []string
	// Cost is what routes are compared by: Estimated in sum mode, Measured
	// in pipe mode (see Rank).
	Cost time.Duration
	// Estimated is the sum of the links' round trips plus the exit's round
	// trip to the target.
	Estimated time.Duration
	// Measured is the round trip measured through the relays plus the
	// exit's round trip to the target; zero when not measured.
	Measured time.Duration
}

// compare orders paths cheapest first; among equal costs fewer hops win,
// then the lexically smaller route, so the order is stable between rounds.
func (p Path) compare(q Path) int {
	return cmp.Or(cmp.Compare(p.Cost, q.Cost), cmp.Compare(len(p.Relays), len(q.Relays)), slices.Compare(p.Relays, q.Relays))
}

func (p Path) String() string { return Key(p.Relays) }

// Cost returns the estimated cost of a given route, and false when a relay
// on it is down or a link of it is not known.
func (g *Graph) Cost(relays []string) (time.Duration, bool) {
	if len(relays) == 0 {
		return 0, false
	}
	var sum time.Duration
	for i, r := range relays {
		if g.down[r] {
			return 0, false
		}
		if i > 0 {
			rtt, ok := g.Link(relays[i-1], r)
			if !ok {
				return 0, false
			}
			sum += rtt
		}
	}
	return sum + g.target[relays[len(relays)-1]], true
}

// Request is what a Chain asks of the router.
type Request struct {
	Entry, Exit string
	Via         []string // relays a route may cross
	MaxHops     int      // most links on a route; 0 means DefaultMaxHops
}

// Candidates returns up to k routes from entry to exit through via relays,
// cheapest first. Among equal costs fewer hops win, then the lexically
// smaller route, so the order is stable from round to round. A route visits
// each relay once and has at most MaxHops links.
//
// It finds them without listing every route (there are about V^(MaxHops-1)
// of them through V via relays): see kShortest.
func Candidates(g *Graph, req Request, k int) []Path {
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
	n := newNetwork(g, req)
	var out []Path
	for _, p := range n.kShortest(k, maxHops) {
		relays := make([]string, len(p.nodes))
		for i, x := range p.nodes {
			relays[i] = n.names[x]
		}
		c := p.cost() + g.target[req.Exit]
		out = append(out, Path{Relays: relays, Cost: c, Estimated: c})
	}
	return out
}

// Reach returns the path with fewest links from one relay to another over
// the links measured, crossing only the given relays on the way (ties go
// to the lower summed round trip, then the lexically smaller path), or nil.
// A route controller uses it to reach relays it has no link to of its own.
func Reach(g *Graph, from, to string, through []string) []string {
	type state struct {
		path []string
		cost time.Duration
	}
	frontier := []state{{path: []string{from}}}
	seen := map[string]bool{from: true}
	for len(frontier) > 0 {
		var found *state
		var next []state
		for _, s := range frontier {
			at := s.path[len(s.path)-1]
			if rtt, ok := g.Link(at, to); ok {
				c := state{append(slices.Clone(s.path), to), s.cost + rtt}
				if found == nil || c.cost < found.cost || c.cost == found.cost && slices.Compare(c.path, found.path) < 0 {
					found = &c
				}
			}
			for _, v := range through {
				if seen[v] || v == to {
					continue
				}
				if rtt, ok := g.Link(at, v); ok {
					next = append(next, state{append(slices.Clone(s.path), v), s.cost + rtt})
				}
			}
		}
		if found != nil {
			return found.path
		}
		for _, s := range next {
			seen[s.path[len(s.path)-1]] = true
		}
		frontier = next
	}
	return nil
}
