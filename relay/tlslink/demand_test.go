package tlslink

import (
	"context"
	"testing"
	"time"
)

// A pool keeps as many spares as its flows asked for within a second, in the
// window before or this one: its base at least, its bound at most. A steady
// rate is no burst, and a quiet window and then another bring the pool
// back to its base.
func TestSparesFollowBursts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	burst := func(n int, at time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = at + time.Duration(i)*time.Millisecond
		}
		return out
	}
	steady := func(n int, every time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i) * every
		}
		return out
	}
	after := demandWindow + time.Second
	for _, tc := range []struct {
		name  string
		asked []time.Duration // when each flow asked for a connection
		at    time.Duration
		spare int
	}{
		{"no demand", nil, 0, 8},
		{"less than the base", burst(3, 0), time.Second, 8},
		{"a burst", burst(40, 0), time.Second, 40},
		{"a burst, the window after", burst(40, 0), after, 40},
		{"a burst and a smaller one after", append(burst(40, 0), burst(12, after)...), after + time.Second, 40},
		{"a burst, two windows after", burst(40, 0), 2*demandWindow + time.Second, 8},
		{"a burst, long after", burst(40, 0), time.Hour, 8},
		{"more than the bound", burst(1000, 0), time.Second, 64},
		{"a steady 5 a second", steady(150, 200*time.Millisecond), 30 * time.Second, 8},
		{"a steady 20 a second", steady(600, 50*time.Millisecond), 30 * time.Second, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d demand
			d.roll(t0)
			for _, at := range tc.asked {
				d.asked(t0.Add(at))
			}
			if got := d.spares(8, 64, t0.Add(tc.at)); got != tc.spare {
				t.Fatalf("spares = %d, want %d", got, tc.spare)
			}
		})
	}
}

// After a burst of flows asked for more connections than the pool had,
// the pool refills to what the burst asked for, those that went without
// counted too, so that the next burst finds them ready.
func TestPoolRefillsToWhatABurstAskedFor(t *testing.T) {
	a, b, got := endpoints(t, 64)
	go func() {
		for range got {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := a.Pools().Pool("b", []string{b.Addr().String()})
	const burst = 24
	served := 0
	for range burst {
		// Flows that would rather ride QUIC than wait: most find none.
		if c := p.Spare(); c != nil {
			served++
			c.Write([]byte("flows"))
			defer c.Close()
		}
	}
	if served == burst {
		t.Fatalf("a pool of 2 spares served a burst of %d", burst)
	}
	for p.Spares() < burst {
		if ctx.Err() != nil {
			t.Fatalf("%d spares after a burst of %d flows, want %d", p.Spares(), burst, burst)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And no more.
	time.Sleep(100 * time.Millisecond)
	if n := p.Spares(); n != burst {
		t.Fatalf("%d spares, want %d", n, burst)
	}
}

// A peer's replicas' pools share its bound of spares.
func TestReplicasShareTheBoundOfSpares(t *testing.T) {
	a, b, _ := endpoints(t, 64)
	ps := a.Pools()
	ps.Replica("b", "r1", []string{b.Addr().String()})
	ps.Replica("b", "r2", []string{b.Addr().String()})
	ps.Pool("c", []string{"127.0.0.1:9"})
	for peer, want := range map[string]int{"b": 2, "c": 1, "x": 1} {
		if n := ps.of(peer); n != want {
			t.Errorf("%s: %d pools, want %d", peer, n, want)
		}
	}
}

// Spares made for a burst are born together; they are renewed before they
// age out, each closed once its replacement is in, so the pool never
// empties on the way (it did: all closed at once, then refilled paced).
func TestSparesAreRenewedBeforeTheyGo(t *testing.T) {
	a, b, got := endpoints(t, 64)
	go func() {
		for range got {
		}
	}()
	a.spareAge = 3 * time.Second // renewed from 2.5 s
	p := a.Pools().Pool("b", []string{b.Addr().String()})
	const burst = 12
	for range burst {
		if c := p.Spare(); c != nil {
			c.Write([]byte("flows"))
			defer c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p.Spares() < burst {
		if ctx.Err() != nil {
			t.Fatalf("%d spares after a burst of %d flows", p.Spares(), burst)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.mu.Lock()
	first := p.spares[0].c
	p.mu.Unlock()
	// Two lives of a spare: every one renewed twice.
	least := burst
	for end := time.Now().Add(2 * a.spareAge); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		least = min(least, p.Spares())
	}
	if least < burst/2 {
		t.Errorf("the pool fell to %d spares while renewing %d", least, burst)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.spares {
		if s.c == first {
			t.Errorf("a spare of %v was still kept after %v", 2*a.spareAge, a.spareAge)
		}
		// Past its age a spare is no longer handed out (spare), and
		// closed at the pool's next look, after a handshake under way.
		if age := time.Since(s.born); age >= a.spareAge+time.Second {
			t.Errorf("a spare of %v kept past its age", age)
		}
	}
	if n := len(p.spares); n < burst/2 || n > burst+refillParallel {
		t.Errorf("%d spares after renewals, want %d", n, burst)
	}
}

// What pools keep above their base after bursts is bounded for the relay,
// however many peers (here: replicas) burst.
func TestSparesAboveTheBaseAreBoundedForTheRelay(t *testing.T) {
	a, b, got := endpoints(t, 64)
	go func() {
		for range got {
		}
	}()
	a.maxAllSpares = 10
	base := a.opts.Spares
	ps := a.Pools()
	pools := []*Pool{ps.Replica("b", "r1", []string{b.Addr().String()}), ps.Replica("b", "r2", []string{b.Addr().String()})}
	for _, p := range pools {
		for range 12 {
			if c := p.Spare(); c != nil {
				c.Write([]byte("flows"))
				defer c.Close()
			}
		}
	}
	total := func() int { return pools[0].Spares() + pools[1].Spares() }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for total() < 2*base+a.maxAllSpares {
		if ctx.Err() != nil {
			t.Fatalf("%d+%d spares after two bursts of 12, want %d in all (base %d)", pools[0].Spares(), pools[1].Spares(), 2*base+a.maxAllSpares, base)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	// One handshake of each pool may be under way as the other fills.
	if n := total(); n > 2*base+a.maxAllSpares+2 {
		t.Errorf("%d spares in two pools of base %d, relay bound %d above the bases", n, base, a.maxAllSpares)
	}
	for i, p := range pools {
		if n := p.Spares(); n < base {
			t.Errorf("pool %d: %d spares, under its base %d", i, n, base)
		}
	}
	if n := ps.extra.Load(); n > int64(a.maxAllSpares)+2 || n < int64(a.maxAllSpares) {
		t.Errorf("the pools count %d above their bases, want %d", n, a.maxAllSpares)
	}
}
