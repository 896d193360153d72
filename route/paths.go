package route

import (
	"cmp"
	"slices"
	"time"
)

// network is a Graph reduced to what one Request may use: the entry, the
// exit, the via relays that are not down, and the links between them that
// a route may take (none into the entry, none out of the exit). Relays are
// numbered in name order, so comparing two routes' numbers compares their
// names: ties are broken as Path.compare breaks them, without a string in
// the inner loops.
type network struct {
	names       []string
	entry, exit int32
	out         [][]edge // by relay
}

type edge struct {
	to  int32
	rtt time.Duration
}

func newNetwork(g *Graph, req Request) *network {
	seen := map[string]bool{req.Entry: true, req.Exit: true}
	names := []string{req.Entry, req.Exit}
	for _, v := range req.Via {
		if !seen[v] && !g.down[v] {
			seen[v] = true
			names = append(names, v)
		}
	}
	slices.Sort(names)
	index := make(map[string]int32, len(names))
	for i, name := range names {
		index[name] = int32(i)
	}
	n := &network{names: names, entry: index[req.Entry], exit: index[req.Exit], out: make([][]edge, len(names))}
	for l, rtt := range g.links {
		from, ok := index[l[0]]
		to, ok2 := index[l[1]]
		if !ok || !ok2 || from == to || from == n.exit || to == n.entry {
			continue
		}
		n.out[from] = append(n.out[from], edge{to, rtt})
	}
	// The links come in the map's random order, which decides nothing: no
	// two walks tie in cost and name order.
	return n
}

// walk is a route by relay number, with the summed RTT up to each relay.
type walk struct {
	nodes []int32
	cum   []time.Duration // cum[i]: from the entry to nodes[i]
}

func (w walk) cost() time.Duration { return w.cum[len(w.cum)-1] }

// compare is Path.compare for walks of one network.
func (w walk) compare(v walk) int {
	return cmp.Or(cmp.Compare(w.cost(), v.cost()), cmp.Compare(len(w.nodes), len(v.nodes)), slices.Compare(w.nodes, v.nodes))
}

// kShortest returns the k first routes from the entry to the exit with at
// most maxHops links in Path.compare's order, by Yen's algorithm. Every
// route after the first leaves an earlier one at some relay (the spur) by
// a link that no earlier route sharing its beginning (the root) took, and
// goes on to the exit without returning to the root. So for the last route
// found and each relay of it, the best such continuation (one search of
// cheapest) is a candidate, and the best candidate not yet taken is the
// next route. Comparing root+spur with root+spur' is comparing spur with
// spur' (same cost added, same hops, same first relays), which is why the
// ties come out as in a full sort. That is at most k*maxHops searches of
// maxHops*links steps each, where listing every route grows as
// relays^maxHops.
func (n *network) kShortest(k, maxHops int) []walk {
	s := n.newSearch(maxHops)
	first, ok := s.cheapest(n.entry, maxHops)
	if !ok {
		return nil
	}
	found := []walk{first}
	var pending []walk
	for len(found) < k {
		last := found[len(found)-1]
		for i := 0; i+1 < len(last.nodes); i++ {
			root := last.nodes[:i+1]
			for _, x := range root[:i] {
				s.blocked[x] = true
			}
			for _, f := range found {
				if len(f.nodes) > i+1 && slices.Equal(f.nodes[:i+1], root) {
					s.banned[f.nodes[i+1]] = true
				}
			}
			spur, ok := s.cheapest(root[i], maxHops-i)
			clear(s.blocked)
			clear(s.banned)
			if !ok {
				continue
			}
			w := walk{nodes: append(slices.Clone(root), spur.nodes[1:]...), cum: slices.Clone(last.cum[:i+1])}
			for _, c := range spur.cum[1:] {
				w.cum = append(w.cum, last.cum[i]+c)
			}
			// The same route can deviate from two earlier ones.
			if !slices.ContainsFunc(pending, func(p walk) bool { return slices.Equal(p.nodes, w.nodes) }) {
				pending = append(pending, w)
			}
		}
		if len(pending) == 0 {
			break
		}
		best := 0
		for i := range pending {
			if pending[i].compare(pending[best]) < 0 {
				best = i
			}
		}
		found = append(found, pending[best])
		pending = slices.Delete(pending, best, best+1)
	}
	return found
}

// search holds the tables of cheapest, reused between searches.
type search struct {
	n       *network
	blocked []bool // relays a spur may not cross: the root's
	banned  []bool // relays a spur may not go to first
	// By layer j (links taken) and relay v, at j*len(names)+v: the cost
	// of the best walk of j links from the spur to v, and the relay before
	// v on it (-1: no walk of j links reaches v).
	cost []time.Duration
	prev []int32
	// The relays reached at the last layer and the one being built.
	front, next []int32
}

func (n *network) newSearch(maxHops int) *search {
	v := len(n.names)
	layers := min(maxHops, v-1) + 1
	return &search{n: n, blocked: make([]bool, v), banned: make([]bool, v),
		cost: make([]time.Duration, layers*v), prev: make([]int32, layers*v)}
}

// cheapest returns the best walk from spur to the exit with at most hops
// links, in Path.compare's order, that crosses no blocked relay, does not
// go first to a banned one, and does not return to the spur.
//
// It is Bellman-Ford by number of links: layer j holds, for every relay,
// the best walk of exactly j links to it, cheapest and then lexically
// smallest. The best walk of j links to v extends the best of j-1 links to
// the relay before v, since walks of one length compare by their cost and
// then by their first difference. Those walks may repeat a relay, but the
// one chosen never does: taking a loop out of a walk leaves it no dearer
// (RTTs are never negative) with fewer links, and the loop cannot hold the
// spur, the only relay whose first link is constrained.
func (s *search) cheapest(spur int32, hops int) (walk, bool) {
	n, v := s.n, int32(len(s.n.names))
	hops = min(hops, len(s.cost)/int(v)-1)
	for i := range s.prev[:(hops+1)*int(v)] {
		s.prev[i] = -1
	}
	s.prev[spur], s.cost[spur] = spur, 0
	s.front = append(s.front[:0], spur)
	bestJ, bestCost := -1, time.Duration(0)
	for j := 1; j <= hops && len(s.front) > 0; j++ {
		base, before := int32(j)*v, int32(j-1)*v
		s.next = s.next[:0]
		for _, u := range s.front {
			cu := s.cost[before+u]
			if bestJ >= 0 && cu >= bestCost {
				continue // cannot beat the exit already reached in fewer links
			}
			for _, e := range n.out[u] {
				to := e.to
				if to == spur || s.blocked[to] || j == 1 && s.banned[to] {
					continue
				}
				c, at := cu+e.rtt, base+to
				switch {
				case s.prev[at] < 0:
					s.next = append(s.next, to)
				case c > s.cost[at] || c == s.cost[at] && !s.earlier(j-1, u, s.prev[at]):
					continue
				}
				s.prev[at], s.cost[at] = u, c
			}
		}
		if at := base + n.exit; s.prev[at] >= 0 && (bestJ < 0 || s.cost[at] < bestCost) {
			bestJ, bestCost = j, s.cost[at]
		}
		s.front, s.next = s.next, s.front
	}
	if bestJ < 0 {
		return walk{}, false
	}
	w := walk{nodes: make([]int32, bestJ+1), cum: make([]time.Duration, bestJ+1)}
	for j, x := bestJ, n.exit; j >= 0; j-- {
		w.nodes[j], w.cum[j] = x, s.cost[int32(j)*v+x]
		x = s.prev[int32(j)*v+x]
	}
	return w, true
}

// earlier reports whether the best walk of j links to a is lexically
// smaller than the one to b. Both start at the spur, so walking them back
// together, the last relays in which they differ are their first
// difference.
func (s *search) earlier(j int, a, b int32) bool {
	v := int32(len(s.n.names))
	less := false
	for ; a != b; j-- {
		less = a < b
		a, b = s.prev[int32(j)*v+a], s.prev[int32(j)*v+b]
	}
	return less
}
