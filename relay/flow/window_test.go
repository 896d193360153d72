package flow

import (
	"slices"
	"testing"
	"time"
)

// TestWindowResetsTheLongestStalledFlow: while a new stream's write waits
// for its connection's window, the Window resets, one at a time, the flow
// whose write to the connection has waited longest, and never one that
// waited less than stalledFor, one between writes, or one still in its own
// first bytes; nothing while no write has waited newFlowWait.
func TestWindowResetsTheLongestStalledFlow(t *testing.T) {
	w := newWindow(func() time.Duration { return 0 })
	w.closed = true // no timer: the test calls check itself
	t0 := now()
	var reset []string
	half := func(name string, stuck time.Duration, settled bool) {
		dst := &StreamEnd{}
		dst.settled.Store(settled)
		h := &stallWatch{win: w, dst: dst, abort: func() { reset = append(reset, name) }}
		if stuck > 0 {
			h.since.Store(int64(t0 - stuck))
		}
		w.add(h)
	}
	half("moving", 0, true)
	half("new", time.Minute, false)
	half("brief", stalledFor/2, true)
	half("stalled 3s", 3*time.Second, true)
	half("stalled 20s", 20*time.Second, true)
	half("stalled 5s", 5*time.Second, true)

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
	want := []string{"stalled 20s", "stalled 5s", "stalled 3s"}
	for i := range want {
		w.check()
		if !slices.Equal(reset, want[:i+1]) {
			t.Fatalf("look %d reset %v, want %v", i+1, reset, want[:i+1])
		}
	}
	w.check()
	if !slices.Equal(reset, want) {
		t.Fatalf("reset %v, want %v", reset, want)
	}
	w.done(wt)
	for h := range w.stuck {
		if h.evicted.Load() {
			t.Fatal("a reset half is still counted stuck")
		}
	}
}
