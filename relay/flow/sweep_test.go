package flow

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hoplink/hoplink/relay/hop"
)

// TestStallSweepLooksOnlyAtStuckWrites: the one sweeper looks at every
// watch of the process. A write under way for stallCheck from an end that
// was reset aborts its flow, once; a watch between writes, or in a write
// younger than stallCheck, or whose end is fine, is left alone; watches
// leave in any order, and once the last has left the sweeper stops, to
// start again with the next.
func TestStallSweepLooksOnlyAtStuckWrites(t *testing.T) {
	var aborts [4]atomic.Int32
	mk := func(i int, src broken) *stallWatch {
		var f firstFault
		return newStallWatch(endOf(src), &StreamEnd{}, A, &f, func() { aborts[i].Add(1) })
	}
	idle := mk(0, true)             // between writes
	young := mk(1, true)            // in a write, too young
	fine := mk(2, false)            // stuck, its end not reset
	stuck := mk(3, true)            // stuck, its end reset
	young.since.Store(int64(now())) // just began
	fine.since.Store(int64(now() - 2*stallCheck))
	stuck.since.Store(int64(now() - 2*stallCheck))
	deadline := time.Now().Add(5 * time.Second)
	for aborts[3].Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * stallSweep) // more looks: the abort stays one
	for i, want := range []int32{0, 0, 0, 1} {
		if got := aborts[i].Load(); got != want {
			t.Errorf("watch %d aborted %d times, want %d", i, got, want)
		}
	}
	if stuck.fault.set.Load() != true || Side(stuck.fault.side.Load()) != A {
		t.Error("the reset was not noted at the side the watch reads")
	}

	// Many watches leaving in any order keep the sweeper's slots right.
	ws := []*stallWatch{idle, young, fine, stuck}
	for range 200 {
		ws = append(ws, mk(0, false))
	}
	rand.Shuffle(len(ws), func(i, j int) { ws[i], ws[j] = ws[j], ws[i] })
	for _, w := range ws {
		w.stop()
		w.stop() // twice is harmless
	}
	stallWatches.mu.Lock()
	left := len(stallWatches.all)
	stallWatches.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d watches left after every flow stopped", left)
	}
	for stopped := false; !stopped; {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper still runs with no watch")
		}
		time.Sleep(stallSweep)
		stallWatches.mu.Lock()
		stopped = !stallWatches.running
		stallWatches.mu.Unlock()
	}
	w := mk(3, true)
	w.since.Store(int64(now() - 2*stallCheck))
	for aborts[3].Load() == 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w.stop()
	if aborts[3].Load() != 2 {
		t.Fatal("a watch added after the sweeper stopped was never looked at")
	}
}

// endOf is an End whose Broken says src.
func endOf(src broken) End { return brokenEnd{src} }

type brokenEnd struct{ broken }

func (brokenEnd) Read([]byte) (int, error)  { return 0, nil }
func (brokenEnd) Write([]byte) (int, error) { return 0, nil }
func (brokenEnd) Wait() error               { return nil }
func (brokenEnd) CloseWrite() error         { return nil }
func (brokenEnd) Abort()                    {}
func (brokenEnd) Fail(hop.Code)             {}
func (brokenEnd) Close()                    {}
