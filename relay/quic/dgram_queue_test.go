package quic

import (
	"testing"
	"time"
)

// Sessions take turns: one that queued a hundred datagrams does not hold
// back one that queued two.
func TestQueueTakesTurns(t *testing.T) {
	var q dgQueue
	at := time.Unix(1000, 0)
	for range 100 {
		q.push(dgQueued{id: 4, p: make([]byte, 100), at: at}, 1<<20)
	}
	q.push(dgQueued{id: 8, p: make([]byte, 100), at: at}, 1<<20)
	q.push(dgQueued{id: 8, p: make([]byte, 100), at: at}, 1<<20)
	var order []uint64
	for range 5 {
		order = append(order, q.head().id)
		q.pop()
	}
	if want := []uint64{4, 8, 4, 8, 4}; !equal(order, want) {
		t.Fatalf("turns %v, want %v", order, want)
	}
	if q.n != 97 || q.bytes != 97*(100+dgOverhead) {
		t.Fatalf("%d datagrams, %d bytes left", q.n, q.bytes)
	}
}

// Past the bound in bytes, the longest session loses its oldest.
func TestQueueBoundDropsFromTheLongest(t *testing.T) {
	var q dgQueue
	at := time.Unix(1000, 0)
	for i := range 10 {
		q.push(dgQueued{id: 4, p: []byte{byte(i)}, at: at}, 12*(1+dgOverhead))
	}
	if d := q.push(dgQueued{id: 8, p: []byte{1}, at: at}, 12*(1+dgOverhead)); d != 0 {
		t.Fatalf("dropped %d within the bound", d)
	}
	if d := q.push(dgQueued{id: 8, p: []byte{2}, at: at}, 12*(1+dgOverhead)); d != 0 {
		t.Fatalf("dropped %d within the bound", d)
	}
	if d := q.push(dgQueued{id: 8, p: []byte{3}, at: at}, 12*(1+dgOverhead)); d != 1 {
		t.Fatalf("dropped %d past the bound, want 1", d)
	}
	if len(q.flows[8]) != 3 || q.flows[4][0].p[0] != 1 {
		t.Fatalf("the long session kept %d from %d, the short %d", len(q.flows[4]), q.flows[4][0].p[0], len(q.flows[8]))
	}
}

// What waited past the deadline goes, in every session.
func TestQueueExpires(t *testing.T) {
	var q dgQueue
	at := time.Unix(1000, 0)
	for i := range 6 {
		q.push(dgQueued{id: uint64(4 * (i % 2)), p: []byte{0}, at: at.Add(time.Duration(i) * time.Millisecond)}, 1<<20)
	}
	if d := q.expire(at.Add(4 * time.Millisecond)); d != 4 {
		t.Fatalf("expired %d, want 4", d)
	}
	if q.n != 2 || q.head().at != at.Add(4*time.Millisecond) {
		t.Fatalf("left %d, head at %v", q.n, q.head().at)
	}
	q.pop()
	q.pop()
	if !q.empty() || len(q.order) != 0 {
		t.Fatalf("not empty: %+v", q)
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
