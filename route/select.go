package route

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Defaults of Hysteresis.
const (
	DefaultMarginFraction = 0.05
	DefaultMarginMin      = 2 * time.Millisecond
	DefaultRounds         = 2
)

// Hysteresis keeps routes from flapping: a better route replaces the current
// one only when it wins by the margin, max(Fraction of the current cost,
// Min), in Rounds consecutive rounds. A current route that crosses a relay
// that is down, or a link not measured any more, is replaced at once.
type Hysteresis struct {
	Fraction float64
	Min      time.Duration
	Rounds   int
}

// DefaultHysteresis is max(5%, 2 ms) for two rounds.
var DefaultHysteresis = Hysteresis{Fraction: DefaultMarginFraction, Min: DefaultMarginMin, Rounds: DefaultRounds}

// Margin is how much cheaper than current a route must be to count as better.
func (h Hysteresis) Margin(current time.Duration) time.Duration {
	return max(time.Duration(h.Fraction*float64(current)), h.Min)
}

// Selector remembers a Chain's current route between rounds.
type Selector struct {
	H       Hysteresis
	current []string
	streak  []string // the challenger of the last rounds
	wins    int
	dropped string // why the current route was dropped, for the next change
}

// Start sets the route in use before the first round (a route decided
// earlier, or one the user wrote), so that it is kept unless a better one
// wins by the margin.
func (s *Selector) Start(route []string) { s.current = slices.Clone(route) }

// Drop forgets the current route, for a reason the next decision gives: the
// next round takes the best candidate at once.
func (s *Selector) Drop(reason string) {
	s.current, s.streak, s.wins, s.dropped = nil, nil, 0, reason
}

// Decision is the outcome of a round.
type Decision struct {
	Route   []string
	Cost    time.Duration // of Route, as measured this round
	Changed bool
	Reason  string // why it changed, for logs and Events
	// Kept says why Route stays although a cheaper candidate exists: the
	// candidate wins by less than the margin, or has not won for enough
	// rounds yet. Empty when Route changed or is the cheapest.
	Kept string
}

// Challenged reports whether a better route has won the last rounds but
// not yet enough of them to replace the current one.
func (s *Selector) Challenged() bool { return s.wins > 0 }

// Current is the route in use, nil before the first decision.
func (s *Selector) Current() []string { return s.current }

// Next takes this round's candidates (cheapest first, as Candidates or
// pipe-mode measurements order them) and the current route's cost this
// round (ok false when the route is broken), and decides.
func (s *Selector) Next(cands []Path, currentCost time.Duration, currentOK bool) Decision {
	if len(cands) == 0 {
		s.streak, s.wins = nil, 0
		return Decision{Route: s.current, Cost: currentCost}
	}
	best := cands[0]
	switch {
	case s.current == nil && s.dropped != "":
		return s.take(best, s.dropped)
	case s.current == nil:
		return s.take(best, "first route")
	case !currentOK:
		return s.take(best, fmt.Sprintf("route %v is broken (a relay is down or a link unmeasured)", s.current))
	case slices.Equal(best.Relays, s.current):
		s.streak, s.wins = nil, 0
		return Decision{Route: s.current, Cost: currentCost}
	}
	margin := s.H.Margin(currentCost)
	if best.Cost >= currentCost-margin {
		s.streak, s.wins = nil, 0
		d := Decision{Route: s.current, Cost: currentCost}
		if best.Cost < currentCost {
			d.Kept = fmt.Sprintf("kept: candidate %s is %v cheaper, below the %s switch threshold",
				Key(best.Relays), roundCost(currentCost-best.Cost), s.threshold(margin))
		}
		return d
	}
	if !slices.Equal(best.Relays, s.streak) {
		s.streak, s.wins = slices.Clone(best.Relays), 0
	}
	s.wins++
	rounds := max(s.H.Rounds, 1)
	if s.wins < rounds {
		return Decision{Route: s.current, Cost: currentCost,
			Kept: fmt.Sprintf("kept: candidate %s is %v cheaper, beyond the %s switch threshold for %d of the %d rounds it must win",
				Key(best.Relays), roundCost(currentCost-best.Cost), s.threshold(margin), s.wins, rounds)}
	}
	return s.take(best, fmt.Sprintf("%v at %v beats %v at %v by more than %v for %d rounds",
		best.Relays, best.Cost.Round(10*time.Microsecond), s.current, currentCost.Round(10*time.Microsecond), s.H.Margin(currentCost).Round(10*time.Microsecond), rounds))
}

// threshold is the margin for a kept reason: what it is now, and the
// rule when the percentage sets it ("2ms / 5%" or "5% = 15ms").
func (s *Selector) threshold(margin time.Duration) string {
	pct := strconv.FormatFloat(100*s.H.Fraction, 'f', -1, 64) + "%"
	if margin > s.H.Min {
		return pct + " = " + roundCost(margin).String()
	}
	return roundCost(s.H.Min).String() + " / " + pct
}

// roundCost rounds a cost for a reason: to 10 µs, as route changes say.
func roundCost(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }

func (s *Selector) take(p Path, reason string) Decision {
	s.current = slices.Clone(p.Relays)
	s.streak, s.wins, s.dropped = nil, 0, ""
	return Decision{Route: s.current, Cost: p.Cost, Changed: true, Reason: reason}
}
