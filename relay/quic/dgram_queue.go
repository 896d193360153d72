package quic

import "time"

// dgQueue holds a paced channel's datagrams in two levels: by Tunnel
// (Share.Key), taken in turn by deficit round robin, each turn worth
// dgQuantum bytes times the Tunnel's weight; then, within a Tunnel, one
// FIFO per session, taken round-robin. When datagrams exceed what the link
// carries, each Tunnel gets its weighted part of the bytes whatever its
// number of sessions (a Tunnel of 100 sessions does not take 100 times
// one of 1), each of its sessions its turn within that, and what sends
// more than its part waits (and loses to the lag bound) alone. Sessions
// without a Share are one Tunnel together.
type dgQueue struct {
	groups  map[string]*dgGroup
	order   []*dgGroup // Tunnels with datagrams waiting, in turn
	next    int
	granted bool // order[next] had its quantum for this turn
	bytes   int  // on the wire: the channel's overhead counted
	n       int
}

// dgQuantum is what a Tunnel of weight 1 may send a turn: a datagram of
// the largest size, so that a turn sends at least one.
const dgQuantum = 1500

// dgGroup is one Tunnel's datagrams.
type dgGroup struct {
	key     string
	weight  int
	flows   map[uint64][]dgQueued
	order   []uint64 // its sessions with datagrams waiting, in turn
	next    int
	deficit int // bytes it may still send this turn
	bytes   int
}

type dgQueued struct {
	id uint64
	p  []byte
	at time.Time
	sh *Share // nil: none
}

func (d dgQueued) size() int { return dgOverhead + len(d.p) }

func (d dgQueued) group() (key string, weight int) {
	if d.sh == nil {
		return "", 1
	}
	return d.sh.Key, max(d.sh.Weight, 1)
}

// dropped tells the datagram's session it was dropped.
func (d dgQueued) dropped() {
	if d.sh != nil && d.sh.Dropped != nil {
		d.sh.Dropped(len(d.p))
	}
}

func (q *dgQueue) empty() bool { return q.n == 0 }

// push adds d, then, while the queue holds more than limit bytes, drops
// the oldest datagram of the longest session of the Tunnel that holds
// the most bytes for its weight; it returns how many it dropped.
func (q *dgQueue) push(d dgQueued, limit int) (dropped int) {
	if q.groups == nil {
		q.groups = map[string]*dgGroup{}
	}
	key, weight := d.group()
	g := q.groups[key]
	if g == nil {
		g = &dgGroup{key: key, flows: map[uint64][]dgQueued{}}
		q.groups[key] = g
		q.order = append(q.order, g)
	}
	g.weight = weight
	if len(g.flows[d.id]) == 0 {
		g.order = append(g.order, d.id)
	}
	g.flows[d.id] = append(g.flows[d.id], d)
	g.bytes += d.size()
	q.bytes += d.size()
	q.n++
	for q.bytes > limit {
		var most *dgGroup
		for _, g := range q.order {
			if most == nil || g.bytes*most.weight > most.bytes*g.weight {
				most = g
			}
		}
		longest, n := uint64(0), 0
		for id, f := range most.flows {
			if len(f) > n {
				longest, n = id, len(f)
			}
		}
		most.flows[longest][0].dropped()
		q.dropHead(most, longest)
		dropped++
	}
	return dropped
}

// turn finds the Tunnel whose turn it is and whose deficit covers its
// next datagram, granting each Tunnel it passes its quantum; the queue
// must not be empty.
func (q *dgQueue) turn() *dgGroup {
	for {
		g := q.order[q.next]
		if !q.granted {
			g.deficit += dgQuantum * g.weight
			q.granted = true
		}
		if g.deficit >= g.flows[g.order[g.next]][0].size() {
			return g
		}
		q.next = (q.next + 1) % len(q.order)
		q.granted = false
	}
}

// head is the datagram whose turn it is; the queue must not be empty.
func (q *dgQueue) head() dgQueued {
	g := q.turn()
	return g.flows[g.order[g.next]][0]
}

// pop removes the head and passes the turn on: to the Tunnel's next
// session, and to the next Tunnel once its deficit is spent (turn).
func (q *dgQueue) pop() {
	g := q.turn()
	id := g.order[g.next]
	g.deficit -= g.flows[id][0].size()
	q.dropHead(g, id)
	if len(g.flows[id]) > 0 {
		g.next++
	}
	if g.next >= len(g.order) {
		g.next = 0
	}
}

// dropHead removes the oldest datagram of session id of g, the session
// from g's turns once it has none, and g from the turns once it has none.
func (q *dgQueue) dropHead(g *dgGroup, id uint64) {
	f := g.flows[id]
	if len(f) == 0 {
		return
	}
	g.bytes -= f[0].size()
	q.bytes -= f[0].size()
	q.n--
	f[0] = dgQueued{}
	if f = f[1:]; len(f) > 0 {
		g.flows[id] = f
		return
	}
	delete(g.flows, id)
	g.order, g.next = without(g.order, id, g.next)
	if len(g.order) > 0 {
		return
	}
	// The Tunnel has nothing waiting: it leaves the turns, and its
	// deficit with it (one that comes back starts afresh).
	delete(q.groups, g.key)
	for i, o := range q.order {
		if o == g {
			q.order = append(q.order[:i], q.order[i+1:]...)
			switch {
			case i < q.next:
				q.next--
			case i == q.next:
				q.granted = false // the next Tunnel's turn starts
			}
			break
		}
	}
	if q.next >= len(q.order) {
		q.next = 0
	}
}

// without removes id from order, keeping next on the same turn.
func without(order []uint64, id uint64, next int) ([]uint64, int) {
	for i, o := range order {
		if o == id {
			order = append(order[:i], order[i+1:]...)
			if i < next {
				next--
			}
			break
		}
	}
	if next >= len(order) {
		next = 0
	}
	return order, next
}

// expire drops every datagram queued before deadline; it returns how many.
func (q *dgQueue) expire(deadline time.Time) (dropped int) {
	for _, g := range append([]*dgGroup(nil), q.order...) {
		for _, id := range append([]uint64(nil), g.order...) {
			for f := g.flows[id]; len(f) > 0 && f[0].at.Before(deadline); f = g.flows[id] {
				f[0].dropped()
				q.dropHead(g, id)
				dropped++
			}
		}
	}
	return dropped
}
