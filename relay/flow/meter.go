package flow

import (
	"sync/atomic"
	"time"
)

// Meter measures a flow's bytes and the span of time they moved in, both
// directions together: what a transport achieved for it. A Join counts
// through Counters, so a Meter rides along as one.
type Meter struct {
	bytes       atomic.Int64
	first, last atomic.Int64 // nanoseconds since epoch; 0 until a byte moves
	epoch       time.Time
}

// NewMeter starts a meter.
func NewMeter() *Meter { return &Meter{epoch: time.Now()} }

// Count returns c counting into the meter as well.
func (m *Meter) Count(c Counter) Counter { return meterCounter{m, c} }

// Bytes is how many bytes moved.
func (m *Meter) Bytes() int64 { return m.bytes.Load() }

// Active is the time from the first counted bytes to the last.
func (m *Meter) Active() time.Duration {
	return time.Duration(m.last.Load() - m.first.Load())
}

type meterCounter struct {
	m *Meter
	c Counter
}

func (mc meterCounter) Add(n float64) {
	mc.c.Add(n)
	m := mc.m
	m.bytes.Add(int64(n))
	// Monotonic and never 0 once a byte moved.
	now := int64(time.Since(m.epoch)) + 1
	m.first.CompareAndSwap(0, now)
	m.last.Store(now)
}
