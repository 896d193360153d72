package relay

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/manifest"
)

// limitWatch tells the operator which Tunnels this relay held to a limit
// lately. It reads the counters the relay keeps anyway (flows refused for
// tunnel_limit, datagrams dropped for rate_limit, TCP time paced to the
// rate) when the relay is asked for its status, and notes when each last
// grew: the flow and datagram paths pay nothing more for the report.
type limitWatch struct {
	mu   sync.Mutex
	hits map[[2]string]*adminapi.LimitHit // by Tunnel and reason
}

// look reads the counters and returns the Tunnels held, latest first.
func (w *limitWatch) look(e *env, set *manifest.Set, now time.Time) []adminapi.LimitHit {
	counts := map[[2]string]float64{}
	add := func(c prometheus.Collector, label, value, reason string) {
		eachCounter(c, func(l map[string]string, v float64) {
			if l["relay"] == e.name && (label == "" || l[label] == value) && l["tunnel"] != "" {
				counts[[2]string{l["tunnel"], reason}] += v
			}
		})
	}
	add(e.m.FlowErrors, "reason", adminapi.LimitFlows, adminapi.LimitFlows)
	add(e.m.UDPDropped, "reason", adminapi.LimitRateDrop, adminapi.LimitRateDrop)
	add(e.m.RateWaited, "", "", adminapi.LimitRateWait) // both directions

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hits == nil {
		w.hits = map[[2]string]*adminapi.LimitHit{}
	}
	for k := range w.hits {
		if _, ok := counts[k]; !ok {
			delete(w.hits, k) // the Tunnel's counters went with it
		}
	}
	for k, v := range counts {
		h := w.hits[k]
		switch {
		case h == nil && v > 0:
			h = &adminapi.LimitHit{Tunnel: k[0], Reason: k[1]}
			w.hits[k] = h
		case h == nil || v <= h.Count:
			if h != nil {
				h.Count = v
			}
			continue
		}
		// The limit in force now is the one that held: the operator
		// ignores a hit of a limit the Tunnel no longer has.
		h.Count, h.At, h.Limit = v, now.UTC(), e.limitText(set, k[0], k[1])
	}
	out := make([]adminapi.LimitHit, 0, len(w.hits))
	for _, h := range w.hits {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b adminapi.LimitHit) int { return b.At.Compare(a.At) })
	return out[:min(len(out), adminapi.MaxLimited)]
}

// limitText names the bound that holds a Tunnel for a reason.
func (e *env) limitText(set *manifest.Set, tunnel, reason string) string {
	t := set.Tunnel(tunnel)
	if reason == adminapi.LimitFlows {
		share := e.flows.perTunnel
		if t != nil && t.Spec.Limits != nil && t.Spec.Limits.MaxFlows > 0 && int(t.Spec.Limits.MaxFlows) <= share {
			return fmt.Sprintf("spec.limits.maxFlows=%d", t.Spec.Limits.MaxFlows)
		}
		return fmt.Sprintf("--max-flows-per-tunnel=%d", share)
	}
	if rateLimited(t) {
		return fmt.Sprintf("spec.limits.rateMbps=%d", t.Spec.Limits.RateMbps)
	}
	return "spec.limits.rateMbps"
}

// eachCounter calls f with each counter of c, its labels and value.
func eachCounter(c prometheus.Collector, f func(labels map[string]string, v float64)) {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil || d.Counter == nil {
			continue
		}
		l := make(map[string]string, len(d.GetLabel()))
		for _, p := range d.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		f(l, d.GetCounter().GetValue())
	}
}
