package tlslink

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// A pool keeps as many spares as its flows took in the window before, or
// in this one, its base at least and maxSpares at most; a quiet window
// and then another bring it back to its base.
func TestSparesFollowDemand(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		took  map[time.Duration]int // at, how many
		at    time.Duration
		spare int
	}{
		{"no demand", nil, 0, 8},
		{"less than the base", map[time.Duration]int{0: 3}, time.Second, 8},
		{"a burst", map[time.Duration]int{0: 40}, time.Second, 40},
		{"a burst, the window after", map[time.Duration]int{0: 40}, demandWindow + time.Second, 40},
		{"a burst and a smaller one after", map[time.Duration]int{0: 40, demandWindow + time.Second: 12}, demandWindow + 2*time.Second, 40},
		{"a burst, two windows after", map[time.Duration]int{0: 40}, 2*demandWindow + time.Second, 8},
		{"a burst, long after", map[time.Duration]int{0: 40}, time.Hour, 8},
		{"more than the bound", map[time.Duration]int{0: 10 * maxSpares}, time.Second, maxSpares},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d demand
			d.roll(t0)
			for _, at := range []time.Duration{0, demandWindow + time.Second} {
				for range tc.took[at] {
					d.took(t0.Add(at))
				}
			}
			if got := d.spares(8, t0.Add(tc.at)); got != tc.spare {
				t.Fatalf("spares = %d, want %d", got, tc.spare)
			}
		})
	}
}

// After a burst of flows took more connections than the pool's base, the
// pool refills to what the burst took, so the next burst finds them ready.
func TestPoolRefillsToWhatABurstTook(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	got := make(chan accepted, 64)
	b := endpoint(t, ca, "b", m, got)
	a := endpoint(t, ca, "a", m, got)
	go func() {
		for range got {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := a.Pools().Pool("b", []string{b.Addr().String()})
	const burst = 24
	for range burst {
		c, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("flows"))
		defer c.Close()
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
