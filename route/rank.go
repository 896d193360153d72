package route

import (
	"slices"
	"strings"
	"time"
)

// Mode is how a chain's routes are compared.
type Mode int

const (
	// Sum prices a route by the sum of its links' measured round trips.
	Sum Mode = iota
	// Pipe prices a route by a measurement end to end through its relays.
	Pipe
)

// Key identifies a route in maps and labels: its relays joined by commas.
func Key(route []string) string { return strings.Join(route, ",") }

// ToMeasure lists the routes to measure end to end this round: in pipe mode
// the candidates and the current route, whose price the Selector needs; in
// sum mode the current route and the best candidate, the one that may take
// its place, so that status shows what the route measures.
func ToMeasure(mode Mode, cands []Path, current []string) [][]string {
	var out [][]string
	for i, c := range cands {
		if mode == Pipe || i == 0 {
			out = append(out, c.Relays)
		}
	}
	if len(current) > 0 && !slices.ContainsFunc(out, func(r []string) bool { return slices.Equal(r, current) }) {
		out = append(out, current)
	}
	return out
}

// Rank prices this round's candidates (as Candidates returns them) and the
// current route for the Selector. measured holds end-to-end round trips by
// Key, entry to exit; the exit's round trip to the target is added to them,
// as it is to estimates. Each Path keeps both figures (Estimated, Measured);
// Cost is the one its mode compares. In pipe mode a candidate that could
// not be measured is out of the running, and so is the current route: it is
// replaced at once, as a broken one is.
func Rank(mode Mode, g *Graph, cands []Path, measured map[string]time.Duration, current []string) (ranked []Path, currentCost time.Duration, currentOK bool) {
	for _, c := range cands {
		if p, ok := Price(mode, g, measured, c.Relays); ok {
			ranked = append(ranked, p)
		}
	}
	slices.SortStableFunc(ranked, Path.compare)
	if len(current) == 0 {
		return ranked, 0, false
	}
	p, ok := Price(mode, g, measured, current)
	return ranked, p.Cost, ok
}

// Price gives one route its figures, as Rank does; ok is false when the
// mode cannot price it this round (a link down, or in pipe mode no
// measurement).
func Price(mode Mode, g *Graph, measured map[string]time.Duration, relays []string) (p Path, ok bool) {
	p.Relays = relays
	p.Estimated, ok = g.Cost(relays)
	if m, done := measured[Key(relays)]; done && len(relays) > 0 {
		p.Measured = m + g.target[relays[len(relays)-1]]
	}
	if mode == Pipe {
		p.Cost = p.Measured
		return p, ok && p.Measured > 0
	}
	p.Cost = p.Estimated
	return p, ok
}
