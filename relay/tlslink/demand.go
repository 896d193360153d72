package tlslink

import "time"

// A pool keeps as many spares as its flows asked for at once lately (the
// most asked within a second, over the current window and the one before), from
// its base (Options.Spares) up to its share of maxSpares. Flows that arrive
// together (a client fleet reconnecting, a batch's workers starting) each
// need a connection; those that find no spare wait for a handshake, and the
// handshakes of a burst queue on the relays' CPU ahead of every request
// already flowing (300 clients at once: 300 handshakes in 50 ms, 190 ms of
// CPU on 2 cores). Spares made before the next such burst cost the same
// handshakes spread over quiet time instead. A steady rate of flows is no
// burst: one at a time, or a few a second, keeps the base. Spares above the
// base are refilled one at a time, refillPace apart, so that refilling after
// a burst is no burst of its own; a pool whose flows stop arriving in
// bursts is back at its base once its spares age out.
const (
	// maxSpares bounds the spares of all of a relay's pools to one peer
	// (its replicas' pools share it): three quarters of what the peer's
	// listener lets one relay hold waiting (MaxWaitingPerPeer), so that
	// connections dialed for flows still fit beside them.
	maxSpares = MaxWaitingPerPeer * 3 / 4
	// MaxAllSpares bounds what all of a relay's pools keep above their
	// base: 12 MiB at about 12 KiB a spare, however many peers burst.
	MaxAllSpares = 1024
	// demandWindow is how long a burst is remembered: a window and the
	// one before, 2.5 to 5 minutes. Bursts recur (a fleet's reconnects,
	// a job every few minutes), and keeping spares costs little: each is
	// renewed every 25 s with a resumed handshake, 384 spares about 15
	// handshakes a second.
	demandWindow = 150 * time.Second
	burstWithin  = time.Second
	refillPace   = 10 * time.Millisecond
	// quickDial bounds a handshake made for a flow that could take
	// another transport (Pool.Quick): on a link short enough for such
	// flows it takes milliseconds, and one that hangs (TCP blocked on the
	// path, a peer that does not answer) must leave the flow time to go
	// another way.
	quickDial = 500 * time.Millisecond
)

// demand is the most connections flows asked a pool for within
// burstWithin, in the current window and the one before: those that found
// none count too (they took QUIC, or waited), or a pool would learn only
// what it already had.
type demand struct {
	start     time.Time
	cur, prev int
	// The burst under way: since when, how many.
	burstAt time.Time
	burst   int
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

func (d *demand) asked(now time.Time) {
	d.roll(now)
	if now.Sub(d.burstAt) >= burstWithin {
		d.burstAt, d.burst = now, 0
	}
	d.burst++
	d.cur = max(d.cur, d.burst)
}

// spares is how many spares the pool keeps now: base at least, bound at
// most (unless base is more).
func (d *demand) spares(base, bound int, now time.Time) int {
	d.roll(now)
	return min(max(base, d.cur, d.prev), max(base, bound))
}
