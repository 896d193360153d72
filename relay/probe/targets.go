package probe

import (
	"context"
	"net"
	"slices"
	"time"

	"github.com/hoplink/hoplink/measure"

	"github.com/hoplink/hoplink/metrics"
)

// TargetSpec names a TCP target an exit relay measures for a Tunnel.
type TargetSpec struct {
	Tunnel string // namespace/name
	Target string // host:port
}

// Targets measures an exit relay's connect time to its Tunnels' targets. A
// connect of a real flow counts as a measurement too (Observe), so a busy
// target is not probed on top of its traffic.
type Targets struct {
	relay   string
	metrics *metrics.Metrics
	dialer  *net.Dialer
	last    coalescer[TargetSpec, measure.Target]
}

// NewTargets makes a target prober for the named exit relay, which
// connects with dialer (nil: any address): the exit's own, so that a
// probe reaches no target a flow could not.
func NewTargets(relay string, m *metrics.Metrics, dialer *net.Dialer) *Targets {
	if dialer == nil {
		dialer = &net.Dialer{}
	}
	return &Targets{relay: relay, metrics: m, dialer: dialer}
}

// maxTargetError bounds the reason a failed connect keeps.
const maxTargetError = 256

// Known returns the last measurement of each spec measured before, and
// whether there was one: what status reports without connecting.
func (t *Targets) Known(spec TargetSpec) (measure.Target, bool) {
	r, age, ok := t.last.peek(spec)
	if ok {
		r.Tunnel, r.Target, r.Age = spec.Tunnel, spec.Target, measure.Duration(age)
	}
	return r, ok
}

// Observe records the connect time of a real flow to a target that routing
// measures.
func (t *Targets) Observe(spec TargetSpec, d time.Duration) {
	r := measure.Target{Tunnel: spec.Tunnel, Target: spec.Target, Up: true, RTT: measure.Duration(d)}
	if t.last.set(spec, r) {
		t.export(spec, r)
	}
}

// Measure returns the targets' connect times, connecting to those not
// measured within fresh, for at most as long as ctx lasts.
func (t *Targets) Measure(ctx context.Context, specs []TargetSpec, fresh time.Duration) []measure.Target {
	return t.last.all(ctx, specs, fresh, func(r measure.Target) bool { return r.Up },
		func(spec TargetSpec) measure.Target { return t.connect(ctx, spec) },
		func(r *measure.Target, spec TargetSpec, age time.Duration) {
			r.Tunnel, r.Target, r.Age = spec.Tunnel, spec.Target, measure.Duration(age)
		})
}

func (t *Targets) connect(ctx context.Context, spec TargetSpec) measure.Target {
	r := measure.Target{Tunnel: spec.Tunnel, Target: spec.Target}
	start := time.Now()
	c, err := t.dialer.DialContext(ctx, "tcp", spec.Target)
	if err == nil {
		r.Up, r.RTT = true, measure.Duration(time.Since(start))
		c.Close()
	} else {
		r.Error = err.Error()
		if len(r.Error) > maxTargetError {
			r.Error = r.Error[:maxTargetError]
		}
	}
	t.export(spec, r)
	return r
}

func (t *Targets) export(spec TargetSpec, r measure.Target) {
	if t.metrics == nil {
		return
	}
	t.metrics.TargetUp.WithLabelValues(t.relay, spec.Tunnel, spec.Target).Set(boolFloat(r.Up))
	if r.Up {
		t.metrics.TargetRTT.WithLabelValues(t.relay, spec.Tunnel, spec.Target).Set(r.RTT.D().Seconds())
	}
}

// Retain forgets every target not in keep, and its metrics.
func (t *Targets) Retain(keep []TargetSpec) {
	gone := t.last.retain(func(s TargetSpec) bool { return slices.Contains(keep, s) })
	if t.metrics == nil {
		return
	}
	for _, spec := range gone {
		t.metrics.TargetUp.DeleteLabelValues(t.relay, spec.Tunnel, spec.Target)
		t.metrics.TargetRTT.DeleteLabelValues(t.relay, spec.Tunnel, spec.Target)
	}
}
