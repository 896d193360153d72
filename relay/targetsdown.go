package relay

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/probe"
)

// dialBook keeps how the last real connect to each Tunnel's target went at
// this exit, bounded, so that status can say a target is down from the
// flows that failed on it, for chains whose targets are not probed (static
// ones) and between probes.
type dialBook struct {
	mu    sync.Mutex
	byKey map[probe.TargetSpec]dialOutcome
}

type dialOutcome struct {
	err string // "" when it connected
	at  time.Time
}

// maxDialBook bounds the targets the book keeps; the least recent goes.
const maxDialBook = 1024

func (b *dialBook) record(spec probe.TargetSpec, err error) {
	o := dialOutcome{at: time.Now()}
	if err != nil {
		o.err = err.Error()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey == nil {
		b.byKey = map[probe.TargetSpec]dialOutcome{}
	}
	if _, ok := b.byKey[spec]; !ok && len(b.byKey) >= maxDialBook {
		var oldest probe.TargetSpec
		var at time.Time
		for k, v := range b.byKey {
			if at.IsZero() || v.at.Before(at) {
				oldest, at = k, v.at
			}
		}
		delete(b.byKey, oldest)
	}
	b.byKey[spec] = o
}

// last is the last connect to spec's target, as a measurement.
func (b *dialBook) last(spec probe.TargetSpec) (measure.Target, bool) {
	b.mu.Lock()
	o, ok := b.byKey[spec]
	b.mu.Unlock()
	if !ok {
		return measure.Target{}, false
	}
	return measure.Target{Tunnel: spec.Tunnel, Target: spec.Target, Up: o.err == "", Error: o.err, Age: measure.Duration(time.Since(o.at))}, true
}

// targetsDown are the TCP targets of the chains this relay exits whose
// last connect failed: a probe's or a flow's, whichever is newer. Targets not
// connected to yet are not counted down. A target found down a while ago
// is tried again first: without a new flow (or a probe, which only routed
// chains have) it would stay down in status for ever.
func targetsDown(e *env, probed *probe.Targets, set *manifest.Set) []measure.Target {
	down := lastDown(e, probed, set)
	var again []probe.TargetSpec
	for _, t := range down {
		if t.Age.D() > recheckAfter && len(again) < adminapi.MaxTargetsDown {
			again = append(again, probe.TargetSpec{Tunnel: t.Tunnel, Target: t.Target})
		}
	}
	if len(again) > 0 {
		recheck(e, again)
		down = lastDown(e, probed, set)
	}
	slices.SortFunc(down, func(a, b measure.Target) int { return cmp.Compare(a.Age, b.Age) })
	return down[:min(len(down), adminapi.MaxTargetsDown)]
}

// lastDown lists the targets whose last connect failed.
func lastDown(e *env, probed *probe.Targets, set *manifest.Set) []measure.Target {
	var out []measure.Target
	for _, t := range set.Tunnels {
		c := set.ChainOf(t)
		if c == nil || c.Spec.Exit != e.name || t.Spec.Protocol != v1alpha1.ProtocolTCP {
			continue
		}
		spec := probe.TargetSpec{Tunnel: manifest.Key(t.Namespace, t.Name), Target: t.Spec.Target}
		seen, ok := e.dials.last(spec)
		if probed != nil {
			if p, pok := probed.Known(spec); pok && (!ok || p.Age < seen.Age) {
				seen, ok = p, true
			}
		}
		if ok && !seen.Up {
			out = append(out, seen)
		}
	}
	return out
}

// recheckAfter is how old a failed connect may be before status tries the
// target again; recheckWait bounds how long it waits for that.
const (
	recheckAfter = 5 * time.Second
	recheckWait  = time.Second
)

// recheck connects to each spec's target at once, as the exit's flows do,
// and records how it went.
func recheck(e *env, specs []probe.TargetSpec) {
	ctx, cancel := context.WithTimeout(e.ctx, recheckWait)
	defer cancel()
	var wg sync.WaitGroup
	for _, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := e.egress.Dialer().DialContext(ctx, "tcp", spec.Target)
			if err == nil {
				c.Close()
			}
			e.dials.record(spec, err)
		}()
	}
	wg.Wait()
}
