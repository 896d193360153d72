package quic

import "time"

// dgQueue holds a paced channel's datagrams, one FIFO per flow, taken
// round-robin: when datagrams exceed what the link carries, each session
// gets its turn, and one that sends more than its share waits (and loses
// to the lag bound) alone.
type dgQueue struct {
	flows map[uint64][]dgQueued
	order []uint64 // flows with datagrams waiting, in turn
	next  int
	bytes int // on the wire: the channel's overhead counted
	n     int
}

type dgQueued struct {
	id uint64
	p  []byte
	at time.Time
}

func (q *dgQueue) empty() bool { return q.n == 0 }

// push adds d, then drops from the head of the longest flow while the
// queue holds more than limit bytes; it returns how many it dropped.
func (q *dgQueue) push(d dgQueued, limit int) (dropped int) {
	if q.flows == nil {
		q.flows = map[uint64][]dgQueued{}
	}
	if len(q.flows[d.id]) == 0 {
		q.order = append(q.order, d.id)
	}
	q.flows[d.id] = append(q.flows[d.id], d)
	q.bytes += dgOverhead + len(d.p)
	q.n++
	for q.bytes > limit {
		longest, most := uint64(0), 0
		for id, f := range q.flows {
			if len(f) > most {
				longest, most = id, len(f)
			}
		}
		q.dropHead(longest)
		dropped++
	}
	return dropped
}

// head is the datagram whose turn it is; the queue must not be empty.
func (q *dgQueue) head() dgQueued { return q.flows[q.order[q.next]][0] }

// pop removes the head and passes the turn on.
func (q *dgQueue) pop() {
	id := q.order[q.next]
	q.dropHead(id)
	if len(q.flows[id]) > 0 {
		q.next++
	}
	if q.next >= len(q.order) {
		q.next = 0
	}
}

// dropHead removes the oldest datagram of flow id, and the flow from the
// turns once it has none.
func (q *dgQueue) dropHead(id uint64) {
	f := q.flows[id]
	if len(f) == 0 {
		return
	}
	q.bytes -= dgOverhead + len(f[0].p)
	q.n--
	f[0] = dgQueued{}
	if f = f[1:]; len(f) > 0 {
		q.flows[id] = f
		return
	}
	delete(q.flows, id)
	for i, o := range q.order {
		if o == id {
			q.order = append(q.order[:i], q.order[i+1:]...)
			if i < q.next {
				q.next--
			}
			break
		}
	}
	if q.next >= len(q.order) {
		q.next = 0
	}
}

// expire drops every datagram queued before deadline; it returns how many.
func (q *dgQueue) expire(deadline time.Time) (dropped int) {
	for _, id := range append([]uint64(nil), q.order...) {
		for f := q.flows[id]; len(f) > 0 && f[0].at.Before(deadline); f = q.flows[id] {
			q.dropHead(id)
			dropped++
		}
	}
	return dropped
}
