package relay

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/flow"
)

// rateLimits holds each Tunnel with spec.limits.rateMbps to its rate, in
// each direction, at this relay: one pair of token buckets per Tunnel,
// shared by all its flows and sessions here.
type rateLimits struct {
	mu      sync.Mutex
	tunnels map[string]*tunnelRate
}

type tunnelRate struct {
	mbps     int32
	up, down *rate.Limiter // bytes: client to target, target to client
}

// minBurst lets a flow write a full copy buffer (flow's 64 KiB) at once:
// a bucket must hold what one write takes, and a smaller one would turn
// every write into several waits.
const minBurst = 64 << 10

// burstTime is how much of the rate a Tunnel may send at once after a
// pause. A flow holds no reservation while its write waits on a congested
// TCP connection, and tokens past a full bucket are lost: at 20 ms a
// Tunnel of 4 flows over TLS carried 16 of its 20 Mbit/s beside a busier
// one (hack/bench/share). 100 ms costs at most a tenth of the rate over in
// the first second of a burst, nothing over longer.
const burstTime = 100 * time.Millisecond

// of returns t's buckets, nil when t has no rate limit.
func (l *rateLimits) of(t *v1alpha1.Tunnel) *tunnelRate {
	if !rateLimited(t) {
		return nil
	}
	key := manifest.Key(t.Namespace, t.Name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tunnels == nil {
		l.tunnels = map[string]*tunnelRate{}
	}
	mbps := t.Spec.Limits.RateMbps
	tr := l.tunnels[key]
	if tr == nil {
		r, burst := bucket(mbps)
		tr = &tunnelRate{mbps: mbps, up: rate.NewLimiter(r, burst), down: rate.NewLimiter(r, burst)}
		l.tunnels[key] = tr
	}
	tr.set(mbps)
	return tr
}

// bucket is the rate (bytes a second) and burst of a limit.
func bucket(mbps int32) (rate.Limit, int) {
	bytesPerSec := float64(mbps) * 1e6 / 8
	return rate.Limit(bytesPerSec), max(minBurst, int(bytesPerSec*burstTime.Seconds()))
}

// set gives the buckets a rate, which the flows already open take too.
func (tr *tunnelRate) set(mbps int32) {
	if tr.mbps == mbps {
		return
	}
	r, burst := bucket(mbps)
	for _, b := range []*rate.Limiter{tr.up, tr.down} {
		b.SetLimit(r)
		b.SetBurst(burst)
	}
	tr.mbps = mbps
}

// sync takes new manifests: a changed rate applies at once to the flows
// open under it; the flows of a Tunnel whose limit (or the Tunnel) went
// are no longer held. A limit a Tunnel gains holds its flows that start
// after it.
func (l *rateLimits) sync(set *manifest.Set) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, tr := range l.tunnels {
		if t := set.Tunnel(key); rateLimited(t) {
			tr.set(t.Spec.Limits.RateMbps)
			continue
		}
		tr.up.SetLimit(rate.Inf)
		tr.down.SetLimit(rate.Inf)
		delete(l.tunnels, key)
	}
}

// rateLimited says whether t has a rate limit.
func rateLimited(t *v1alpha1.Tunnel) bool {
	return t != nil && t.Spec.Limits != nil && t.Spec.Limits.RateMbps > 0
}

// pacedCounter holds a flow's direction to its Tunnel's bucket: before
// each write the copy takes the bytes from the bucket, waiting until it
// has them (flow.Pacer), so no flow's first buffer runs ahead of the rate,
// however many flows start at once. The wait ends early if the flow fails.
type pacedCounter struct {
	flow.Counter
	b      *rate.Limiter
	waited flow.Counter // seconds spent waiting
}

// paceStep is how often a waiting flow looks whether it failed: a flow
// of a Tunnel that many flows share may wait long for its turn, and one
// whose client left must not hold its goroutine, its flow token and a
// drain that long.
const paceStep = 100 * time.Millisecond

func (p pacedCounter) Pace(n int, gone func() bool) { wait(p.b, n, gone, p.waited) }

// wait takes n bytes from b, waiting until it has them or gone says the
// flow failed, and counts the time waited into waited (if not nil).
func wait(b *rate.Limiter, n int, gone func() bool, waited flow.Counter) {
	now := time.Now()
	var held [2]*rate.Reservation // a write takes one bucket's burst or two
	rs := held[:0]
	var wait time.Duration
	for left := n; left > 0; {
		take := min(left, b.Burst())
		r := b.ReserveN(now, take)
		rs = append(rs, r)
		wait = max(wait, r.DelayFrom(now))
		left -= take
	}
	if wait <= 0 {
		return
	}
	if waited != nil {
		defer func() { waited.Add(time.Since(now).Seconds()) }()
	}
	for until := now.Add(wait); ; {
		d := time.Until(until)
		if d <= 0 {
			return
		}
		time.Sleep(min(d, paceStep))
		if gone() {
			for _, r := range rs {
				r.Cancel() // what it will not send goes back to the others
			}
			return
		}
	}
}

// upLimiter is the client-to-target bucket, nil without a limit.
func (tr *tunnelRate) upLimiter() *rate.Limiter {
	if tr == nil {
		return nil
	}
	return tr.up
}

// downRate is t's target-to-client bucket for UDP replies (nil without a
// limit), and the counter of replies dropped over it.
func (e *env) downRate(t *v1alpha1.Tunnel) (*rate.Limiter, prometheus.Counter) {
	tr := e.limits.of(t)
	if tr == nil {
		return nil, nil
	}
	return tr.down, e.m.UDPDropped.WithLabelValues(e.name, manifest.Key(t.Namespace, t.Name), "rate_limit")
}

// allow takes n bytes of a datagram from b, or says it is over the rate.
func allow(b *rate.Limiter, n int) bool {
	return b == nil || b.AllowN(time.Now(), n)
}

// limitsText says a Tunnel's limits for status: "20 Mbit/s, 100 flows".
func limitsText(l *v1alpha1.TunnelLimits) string {
	if l == nil {
		return ""
	}
	var parts []string
	if l.RateMbps > 0 {
		parts = append(parts, fmt.Sprintf("%d Mbit/s", l.RateMbps))
	}
	if l.MaxFlows > 0 {
		parts = append(parts, fmt.Sprintf("%d flows", l.MaxFlows))
	}
	return strings.Join(parts, ", ")
}
