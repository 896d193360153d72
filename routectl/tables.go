package routectl

import (
	"context"
	"sync"
	"time"

	"github.com/hoplink/hoplink/measure"
)

// tableBook holds a chain's link requests in flight and the last table each
// relay answered. A round waits for answers until its tables deadline and
// no longer; a request outlives it (up to askTimeout), and an answer that
// comes later counts in the next rounds while it is younger than keepTable.
// So a relay whose answers come late on a busy host still prices routes,
// rather than being unmeasured in every round because every round gave up
// on it a moment too soon; and a relay that never answers holds up no round.
// At most one request per relay is in flight: a round finds the one an
// earlier round left and waits for it instead of adding another.
type tableBook struct {
	mu      sync.Mutex
	last    map[string]keptTable
	pending map[string]*tableAsk
}

type keptTable struct {
	t  *measure.Table
	at time.Time // when it came, on the controller's clock
}

// tableAsk is one link request; done closes when it has an answer or failed.
type tableAsk struct {
	done chan struct{}
	t    *measure.Table
	err  error
}

// askTimeout bounds a link request: it may run past the round that made
// it, so that its answer serves the next one, but not past the round after.
func askTimeout(interval time.Duration) time.Duration { return 2 * interval }

// keepTable is how long a relay's table prices routes in rounds it did not
// answer in time: two intervals, after which it counts as unmeasured.
func keepTable(interval time.Duration) time.Duration { return 2 * interval }

// ask returns relay's request in flight, or starts one with links, bounded
// by askTimeout and ended with ctx (the chain's rounds).
func (b *tableBook) ask(ctx context.Context, relay string, timeout time.Duration, now func() time.Time,
	links func(context.Context) (*measure.Table, error)) *tableAsk {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a := b.pending[relay]; a != nil {
		return a
	}
	if b.pending == nil {
		b.pending, b.last = map[string]*tableAsk{}, map[string]keptTable{}
	}
	a := &tableAsk{done: make(chan struct{})}
	b.pending[relay] = a
	go func() {
		actx, cancel := context.WithTimeout(ctx, timeout)
		t, err := links(actx)
		cancel()
		b.mu.Lock()
		if err == nil && t != nil {
			b.last[relay] = keptTable{t, now()}
		}
		delete(b.pending, relay)
		a.t, a.err = t, err
		b.mu.Unlock()
		close(a.done)
	}()
	return a
}

// kept returns relay's last table if it came within maxAge.
func (b *tableBook) kept(relay string, now time.Time, maxAge time.Duration) *measure.Table {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.last[relay]
	if !ok || now.Sub(k.at) > maxAge {
		return nil
	}
	return k.t
}

// retain forgets the tables of relays no longer in the chain.
func (b *tableBook) retain(keep func(string) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.last {
		if !keep(r) {
			delete(b.last, r)
		}
	}
}
