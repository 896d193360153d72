package relay

import "testing"

// TestFairShareSlowGrowerDoesNotStarve: a backlogged Tunnel that carries
// little (its target reads slowly, so its flows' writes to the link
// block, or its datagrams are dropped) and grows by a tenth every
// spareCheck windows while the caps leave the link spare is never found
// bound elsewhere. The capacity, learnt from what the link carries while
// the other Tunnel is capped, then decays at capacityDecay to about twice
// the slow Tunnel's rate, and the other's cap (its share) with it: the
// victim is held near the slow Tunnel's rate for as long as it stays.
//
// With the spare check judged against the capacity, the victim ended at
// 4.4 of 100 Mbit/s beside a Tunnel carrying 4.1. Judged against the
// link's slowly forgotten peak, the slow Tunnel must keep growing into the
// room the caps free, or it is taken as bound elsewhere and the caps lift.
func TestFairShareSlowGrowerDoesNotStarve(t *testing.T) {
	s := newFairSim(t)
	victim, _ := s.fs.join("peer", "ns-a/victim", 0, nil)
	slow, _ := s.fs.join("peer", "ns-b/slow", 0, nil)
	ts := []*fairTunnel{victim, slow}
	x := 0.2 // Mbit/s the slow Tunnel's target reads
	var got []float64
	for w := range 1200 {
		// It grows only while the caps leave the link spare (the
		// allocator's check for a Tunnel bound elsewhere), then holds.
		if l := s.fs.links["peer"]; w%spareCheck == 0 && (l == nil || l.capacity == 0 || x < l.capacity/mbit/4) {
			x *= 1.11
		}
		got = []float64{min(100-x, capOf(victim)), x}
		s.window(ts, got, []bool{true, true})
		if w%40 == 0 {
			t.Logf("%3ds: victim %.1f (cap %.1f), slow %.2f, capacity %.1f", w/4, got[0], capOf(victim), got[1], s.fs.links["peer"].capacity/mbit)
		}
	}
	if got[0] < 40 {
		t.Errorf("after 5 min beside a Tunnel carrying %.1f of 100 Mbit/s, the victim carries %.1f", got[1], got[0])
	}
}
