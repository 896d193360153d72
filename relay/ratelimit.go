package relay

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/prometheus/client_golang/prometheus"
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

// of returns t's buckets, nil when t has no rate limit. A changed rate
// applies to the flows already open.
func (l *rateLimits) of(t *v1alpha1.Tunnel) *tunnelRate {
	if t == nil || t.Spec.Limits == nil || t.Spec.Limits.RateMbps <= 0 {
		return nil
	}
	mbps := t.Spec.Limits.RateMbps
	bytesPerSec := float64(mbps) * 1e6 / 8
	burst := max(minBurst, int(bytesPerSec*burstTime.Seconds()))
	key := manifest.Key(t.Namespace, t.Name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tunnels == nil {
		l.tunnels = map[string]*tunnelRate{}
	}
	tr := l.tunnels[key]
	switch {
	case tr == nil:
		tr = &tunnelRate{mbps: mbps, up: rate.NewLimiter(rate.Limit(bytesPerSec), burst), down: rate.NewLimiter(rate.Limit(bytesPerSec), burst)}
		l.tunnels[key] = tr
	case tr.mbps != mbps:
		for _, b := range []*rate.Limiter{tr.up, tr.down} {
			b.SetLimit(rate.Limit(bytesPerSec))
			b.SetBurst(burst)
		}
		tr.mbps = mbps
	}
	return tr
}

// retain forgets the buckets of Tunnels no longer in set.
func (l *rateLimits) retain(set *manifest.Set) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.tunnels {
		if set.Tunnel(key) == nil {
			delete(l.tunnels, key)
		}
	}
}

// pacedCounter is a flow's byte counter that, once the bytes are counted, makes
// the copy wait until the Tunnel's bucket has them: the next read from
// the sender comes only then, so TCP's own flow control slows the sender.
type pacedCounter struct {
	flow.Counter
	b      *rate.Limiter
	waited flow.Counter // seconds spent waiting
}

func (p pacedCounter) Add(n float64) {
	p.Counter.Add(n)
	now := time.Now()
	var wait time.Duration
	for left := int(n); left > 0; {
		take := min(left, p.b.Burst())
		wait = max(wait, p.b.ReserveN(now, take).DelayFrom(now))
		left -= take
	}
	if wait > 0 {
		time.Sleep(wait)
		p.waited.Add(wait.Seconds())
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
