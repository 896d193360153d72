package probe

import (
	"context"
	"sync"
	"time"
)

// coalescer shares measurements by key: a value measured less than `fresh`
// ago is reused, and callers that ask while a measurement runs wait for it
// instead of starting another. That bounds the cost per peer or target
// however many chains and controllers ask.
type coalescer[K comparable, V any] struct {
	mu    sync.Mutex
	slots map[K]*slot[V]
}

type slot[V any] struct {
	last    V
	done    time.Time     // zero before the first measurement
	running chan struct{} // closed when the measurement in progress ends
}

// do returns key's value and its age, measuring it with run when needed.
// A value that reuse rejects (a link found down) is measured again however
// fresh it is. ok is false when ctx ended while waiting for another
// caller's run.
func (c *coalescer[K, V]) do(ctx context.Context, key K, fresh time.Duration, reuse func(V) bool, run func() V) (v V, age time.Duration, ok bool) {
	for {
		c.mu.Lock()
		if c.slots == nil {
			c.slots = map[K]*slot[V]{}
		}
		s := c.slots[key]
		if s == nil {
			s = &slot[V]{}
			c.slots[key] = s
		}
		if !s.done.IsZero() && time.Since(s.done) < fresh && reuse(s.last) {
			v, age = s.last, time.Since(s.done)
			c.mu.Unlock()
			return v, age, true
		}
		if running := s.running; running != nil {
			c.mu.Unlock()
			select {
			case <-running:
				fresh = max(fresh, time.Hour) // take the round that just ended
				continue
			case <-ctx.Done():
				return v, 0, false
			}
		}
		running := make(chan struct{})
		s.running = running
		c.mu.Unlock()
		v = run()
		c.mu.Lock()
		s.last, s.done, s.running = v, time.Now(), nil
		c.mu.Unlock()
		close(running)
		return v, 0, true
	}
}

// set records a value measured elsewhere, if key is tracked.
func (c *coalescer[K, V]) set(key K, v V) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if s == nil {
		return false
	}
	s.last, s.done = v, time.Now()
	return true
}

// setIf records a value measured elsewhere, if key is tracked, no
// measurement of it runs, and its last value passes cond.
func (c *coalescer[K, V]) setIf(key K, v V, cond func(V) bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if s == nil || s.running != nil || s.done.IsZero() || !cond(s.last) {
		return false
	}
	s.last, s.done = v, time.Now()
	return true
}

// stale makes key's value too old to reuse: the next call measures.
func (c *coalescer[K, V]) stale(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.slots[key]; s != nil {
		s.done = time.Time{}
	}
}

// retain forgets every key for which keep is false and returns them.
func (c *coalescer[K, V]) retain(keep func(K) bool) []K {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gone []K
	for k := range c.slots {
		if !keep(k) {
			delete(c.slots, k)
			gone = append(gone, k)
		}
	}
	return gone
}

// peek returns key's last value and its age without measuring; ok is
// false before its first measurement.
func (c *coalescer[K, V]) peek(key K) (v V, age time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if s == nil || s.done.IsZero() {
		return v, 0, false
	}
	return s.last, time.Since(s.done), true
}

// all measures every key at once, as one round (a slow peer or target
// costs its own figure, not the others'), each as do would; label writes
// a key and its value's age into the value.
func (c *coalescer[K, V]) all(ctx context.Context, keys []K, fresh time.Duration, reuse func(V) bool, run func(K) V, label func(*V, K, time.Duration)) []V {
	out := make([]V, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			v, age, _ := c.do(ctx, k, fresh, reuse, func() V { return run(k) })
			label(&v, k, age)
			out[i] = v
		})
	}
	wg.Wait()
	return out
}
