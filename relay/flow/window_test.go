package flow

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestWindowResetsTheLongestStalledFlows: while a new stream's write waits
// for its connection's window, the Window resets the flows whose write to
// the connection has waited longest, one at the first look and one more at
// each look after that finds the write still waiting; never one that
// waited less than stalledFor, one between writes, or one still in its own
// first bytes; nothing while no write has waited newFlowWait. Once the
// writes are through, the next wait starts again at one.
func TestWindowResetsTheLongestStalledFlows(t *testing.T) {
	w := newWindow(func() time.Duration { return 0 })
	w.closed = true // no timer: the test calls check itself
	t0 := now()
	var reset []string
	halves := map[string]*stallWatch{}
	half := func(name string, stuck time.Duration, settled bool) {
		dst := &StreamEnd{}
		dst.settled.Store(settled)
		h := &stallWatch{src: broken(false), win: w, dst: dst, abort: func() { reset = append(reset, name) }}
		if stuck > 0 {
			h.since.Store(int64(t0 - stuck))
		}
		w.add(h)
		halves[name] = h
	}
	half("moving", 0, true)
	half("new", time.Hour, false)
	half("brief", stalledFor/2, true)
	var stalled []string // longest first
	for i := range 8 {
		stalled = append(stalled, fmt.Sprintf("stalled %ds", 60-i))
	}
	for _, i := range []int{3, 0, 7, 5, 1, 6, 2, 4} {
		half(stalled[i], time.Duration(60-i)*time.Second, true)
	}
	// A flow its previous hop reset too is reset in its turn, and counted
	// here as well: this relay's reset frees this connection's window.
	halves[stalled[1]].src = broken(true)

	w.check()
	if len(reset) > 0 {
		t.Fatalf("reset %v with no write waiting", reset)
	}
	wt := &waiter{since: t0}
	w.wait(wt)
	w.check()
	if len(reset) > 0 {
		t.Fatalf("reset %v for a write that waited less than %v", reset, newFlowWait)
	}
	wt.since = t0 - newFlowWait
	w.check()
	w.check()
	if want := stalled[:3]; !slices.Equal(reset, want) {
		t.Fatalf("two looks reset %v, want %v", reset, want)
	}
	w.done(wt)
	w.check() // the write went through
	wt = &waiter{since: t0 - newFlowWait}
	w.wait(wt)
	w.check()
	if want := stalled[:4]; !slices.Equal(reset, want) {
		t.Fatalf("a new wait's first look: reset %v, want %v", reset, want)
	}
	for range 3 {
		w.check()
	}
	if !slices.Equal(reset, stalled) {
		t.Fatalf("reset %v, want %v and no other", reset, stalled)
	}
	for h := range w.stuck {
		if h.evicted.Load() {
			t.Fatal("a reset half is still counted stuck")
		}
	}
	for name, h := range halves {
		if want := slices.Contains(stalled, name); h.evicted.Load() != want {
			t.Errorf("%s: reset for the window %v, want %v", name, h.evicted.Load(), want)
		}
	}
}

// broken is a source that says whether its peer reset it.
type broken bool

func (b broken) Broken() bool { return bool(b) }
