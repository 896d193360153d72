package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultFirstStatusWait is how long a new Chain or Tunnel waiting only
// for what is still coming up (its relays, its Chain) goes without a Ready
// condition before it says that it waits (Options.FirstStatusWait).
const DefaultFirstStatusWait = 10 * time.Second

// firstStatus holds back a new object's first Ready condition while it
// would only say "not ready yet: what it needs is coming up", for at most
// wait from the first reconcile that would have written it. After a large
// apply nearly every Chain and Tunnel was first written NotReady and then
// Ready a moment later, when its relays came up: a status write of every
// one of them for a state that lasted seconds (issue 41: 1.78 status
// writes a Chain, 1.42 a Tunnel). An object that waits longer, or for
// anything else (a relay that does not exist, a Service in the way), or
// that has a Ready condition already, is written as before, so no object
// goes without a condition for long and none hides a problem.
type firstStatus struct {
	wait time.Duration // 0: never hold back

	mu    sync.Mutex
	since map[string]time.Time // key -> first held back
}

// hold says how much longer key's status may wait (0: write it now): only
// when conds, what the object has, hold no Ready condition yet and cond,
// what would be written, says it is not ready for a reason that is coming
// up. Its clock starts at the first hold.
func (f *firstStatus) hold(key string, conds []metav1.Condition, cond metav1.Condition, comingUp bool) time.Duration {
	if f.wait <= 0 || !comingUp || cond.Status == metav1.ConditionTrue || meta.FindStatusCondition(conds, conditionReady) != nil {
		f.forget(key)
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since == nil {
		f.since = map[string]time.Time{}
	}
	t, ok := f.since[key]
	if !ok {
		t = time.Now()
		f.since[key] = t
	}
	left := f.wait - time.Since(t)
	if left <= 0 {
		delete(f.since, key)
		return 0
	}
	return left
}

func (f *firstStatus) forget(key string) {
	f.mu.Lock()
	delete(f.since, key)
	f.mu.Unlock()
}

// sooner is the earlier of two requeue delays, 0 being none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
