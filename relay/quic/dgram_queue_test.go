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
	flows := q.groups[""].flows
	if len(flows[8]) != 3 || flows[4][0].p[0] != 1 {
		t.Fatalf("the long session kept %d from %d, the short %d", len(flows[4]), flows[4][0].p[0], len(flows[8]))
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

// drain pops the queue empty and says what each Tunnel sent, in bytes on
// the wire, before the first of them ran dry.
func drain(q *dgQueue) map[string]int {
	got := map[string]int{}
	for !q.empty() {
		d := q.head()
		if len(q.groups) < 2 {
			break // one Tunnel left: no more sharing to judge
		}
		k, _ := d.group()
		got[k] += d.size()
		q.pop()
	}
	return got
}

// Tunnels take turns by bytes, not sessions: a Tunnel of 32 sessions and
// one of 1, both with more queued than the link takes, send about as
// much each; with weights 3 and 1, three quarters and a quarter.
func TestQueueSharesByTunnel(t *testing.T) {
	at := time.Unix(1000, 0)
	for _, tc := range []struct {
		name         string
		many, one    int // weights
		wantOneShare float64
	}{
		{"even", 1, 1, 0.5},
		{"the lone session's Tunnel weighs 3", 1, 3, 0.75},
		{"the many sessions' Tunnel weighs 3", 3, 1, 0.25},
	} {
		var q dgQueue
		many := &Share{Key: "ns/many", Weight: tc.many}
		one := &Share{Key: "ns/one", Weight: tc.one}
		for range 200 {
			for s := range 32 {
				q.push(dgQueued{id: uint64(4 * (s + 1)), p: make([]byte, 1000), at: at, sh: many}, 1<<30)
			}
		}
		// The lone session sends smaller datagrams: bytes count, not
		// datagrams.
		for range 10000 {
			q.push(dgQueued{id: 4000, p: make([]byte, 500), at: at, sh: one}, 1<<30)
		}
		got := drain(&q)
		share := float64(got["ns/one"]) / float64(got["ns/one"]+got["ns/many"])
		if share < tc.wantOneShare-0.02 || share > tc.wantOneShare+0.02 {
			t.Errorf("%s: the lone session's Tunnel sent %.1f%% of the bytes, want %.0f%%", tc.name, 100*share, 100*tc.wantOneShare)
		}
	}
}

// Within a Tunnel its sessions take turns as before.
func TestQueueSessionsOfATunnelTakeTurns(t *testing.T) {
	var q dgQueue
	at := time.Unix(1000, 0)
	sh := &Share{Key: "ns/t"}
	for range 10 {
		q.push(dgQueued{id: 4, p: make([]byte, 100), at: at, sh: sh}, 1<<20)
	}
	q.push(dgQueued{id: 8, p: make([]byte, 100), at: at, sh: sh}, 1<<20)
	q.push(dgQueued{id: 8, p: make([]byte, 100), at: at, sh: sh}, 1<<20)
	var order []uint64
	for range 5 {
		order = append(order, q.head().id)
		q.pop()
	}
	if want := []uint64{4, 8, 4, 8, 4}; !equal(order, want) {
		t.Fatalf("turns %v, want %v", order, want)
	}
}

// Past the bound the Tunnel with the most bytes for its weight loses,
// whatever its number of sessions, and its sessions are told.
func TestQueueBoundDropsFromTheLargestTunnel(t *testing.T) {
	var q dgQueue
	at := time.Unix(1000, 0)
	var lostMany, lostOne int
	many := &Share{Key: "many", Dropped: func(n int) { lostMany += n }}
	one := &Share{Key: "one", Weight: 2, Dropped: func(n int) { lostOne += n }}
	limit := 30 * (10 + dgOverhead)
	for i := range 20 {
		q.push(dgQueued{id: uint64(4 * (i + 1)), p: make([]byte, 10), at: at, sh: many}, limit)
	}
	for range 20 {
		q.push(dgQueued{id: 400, p: make([]byte, 10), at: at, sh: one}, limit)
	}
	// 40 pushed into room for 30: weight 2 beside 1, "one" keeps 20,
	// "many" 10.
	if n := len(q.groups["one"].flows[400]); n != 20 || lostOne != 0 {
		t.Fatalf("the weight-2 Tunnel kept %d of 20 and was told of %d bytes lost, want all kept", n, lostOne)
	}
	if lostMany != 10*10 {
		t.Fatalf("the other was told of %d bytes lost, want 100", lostMany)
	}
	if late := q.expire(at.Add(time.Millisecond)); late != 30 || lostOne != 200 {
		t.Fatalf("expired %d (want 30), the weight-2 Tunnel told of %d bytes (want 200)", late, lostOne)
	}
}

// The loss a sample shows is shared out among the Tunnels by the bytes
// their sessions sent since the last sample, and the count starts anew.
func TestChannelSharesOutTheLinkLoss(t *testing.T) {
	var ch dgChannel
	var lostA, lostB int
	a := &Share{Key: "a", Lost: func(n int) { lostA += n }}
	b := &Share{Key: "b", Lost: func(n int) { lostB += n }}
	ch.sentByLocked(a, 30000)
	ch.sentByLocked(b, 10000)
	ch.sentByLocked(nil, 5000) // a session without a Share
	ch.shareLossLocked(dgSample{sent: 100, lost: 50})
	if lostA != 15000 || lostB != 5000 {
		t.Fatalf("half the packets lost: a told of %d bytes (want 15000), b of %d (want 5000)", lostA, lostB)
	}
	ch.shareLossLocked(dgSample{sent: 100, lost: 50})
	if lostA != 15000 || lostB != 5000 {
		t.Fatal("the loss of a second sample was shared out by the first one's bytes")
	}
}
