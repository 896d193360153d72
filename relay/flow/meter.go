package flow

import (
	"sync/atomic"
	"time"
)

// Meter measures a flow's bytes and the span of time they moved in, both
// directions together: what a transport achieved for it; and its turns,
// how often the direction bytes moved in changed: a request/response flow
// turns at every answer, a bulk flow hardly ever. A Join counts through
// Counters, so a Meter rides along as two.
type Meter struct {
	bytes       atomic.Int64
	first, last atomic.Int64 // nanoseconds since epoch; 0 until a byte moves
	dir         atomic.Int32 // the direction bytes last moved in: 1 up, 2 down
	turns       atomic.Int64
	epoch       time.Time
}

// Directions of Count.
const (
	Up   = 1
	Down = 2
)

// NewMeter starts a meter.
func NewMeter() *Meter { return &Meter{epoch: time.Now()} }

// Count returns c, a counter of direction dir (Up or Down), counting into
// the meter as well.
func (m *Meter) Count(c Counter, dir int32) Counter {
	if p, ok := c.(Pacer); ok {
		// A flow held to its Tunnel's share of a link is paced still.
		return meterPacer{meterCounter{m, c, dir}, p}
	}
	return meterCounter{m, c, dir}
}

type meterPacer struct {
	meterCounter
	p Pacer
}

func (mp meterPacer) Pace(n int, gone func() bool) { mp.p.Pace(n, gone) }

func (mp meterPacer) TryPace(n int) bool {
	tp, ok := mp.p.(tryPacer)
	return ok && tp.TryPace(n)
}

// Turns is how many times the direction changed.
func (m *Meter) Turns() int64 { return m.turns.Load() }

// Bytes is how many bytes moved.
func (m *Meter) Bytes() int64 { return m.bytes.Load() }

// Active is the time from the first counted bytes to the last.
func (m *Meter) Active() time.Duration {
	return time.Duration(m.last.Load() - m.first.Load())
}

type meterCounter struct {
	m   *Meter
	c   Counter
	dir int32
}

func (mc meterCounter) Add(n float64) {
	mc.c.Add(n)
	m := mc.m
	m.bytes.Add(int64(n))
	// Monotonic and never 0 once a byte moved.
	now := int64(time.Since(m.epoch)) + 1
	m.first.CompareAndSwap(0, now)
	m.last.Store(now)
	if old := m.dir.Swap(mc.dir); old != 0 && old != mc.dir {
		m.turns.Add(1)
	}
}
