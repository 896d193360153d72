package tlslink

import "time"

// A pool keeps as many spares as its flows took in a recent window, from
// its base (Options.Spares) up to maxSpares. Flows that arrive together (a
// client fleet reconnecting, a batch's workers starting) each need a
// connection; those that find no spare wait for a handshake, and the
// handshakes of a burst queue on the relays' CPU ahead of every request
// already flowing (300 clients at once: 300 handshakes in 50 ms, 190 ms of
// CPU on 2 cores). Spares made before the next such burst cost the same
// handshakes spread over quiet time instead. They are refilled above the
// base one at a time, refillPace apart, so that refilling after a burst
// does not become a burst of its own; and a pool whose flows stop taking
// them goes back to its base as its spares age out.
const (
	// maxSpares bounds a pool's spares: what the peer's listener lets
	// one relay hold waiting (MaxWaitingPerPeer), half of it, so that a
	// second pool to the same relay (a replica's) still fits.
	maxSpares = MaxWaitingPerPeer / 2
	// demandWindow is how long a burst's demand is remembered: a window
	// and the one before.
	demandWindow = spareMaxAge
	refillPace   = 10 * time.Millisecond
)

// demand counts the connections flows took from a pool, spares and dials,
// in the current window and the one before.
type demand struct {
	start     time.Time
	cur, prev int
}

// roll moves the windows on to now.
func (d *demand) roll(now time.Time) {
	switch since := now.Sub(d.start); {
	case since < demandWindow:
		return
	case since < 2*demandWindow:
		d.prev, d.cur = d.cur, 0
	default:
		d.prev, d.cur = 0, 0
	}
	d.start = now
}

func (d *demand) took(now time.Time) {
	d.roll(now)
	d.cur++
}

// spares is how many spares the pool keeps now, base at least.
func (d *demand) spares(base int, now time.Time) int {
	d.roll(now)
	return min(max(base, d.cur, d.prev), max(base, maxSpares))
}
