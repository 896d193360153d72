package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/probe"
	"github.com/hoplink/hoplink/relay/ratelog"
)

// env is what every role of a relay shares: its name, logger and metrics,
// the manifests in force, the flow quota, and the relay's lifetime. Roles
// get it and the few other parts they use, named in their own types.
type env struct {
	name         string
	log          *slog.Logger
	warn         *ratelog.Logger // for what peers can make the relay log
	m            *metrics.Metrics
	set          *atomic.Pointer[manifest.Set]
	setupTimeout time.Duration
	flows        *quota // a token per flow in progress
	// draining: the relay takes no new flows (Relay.Drain).
	draining atomic.Bool
	// problems keeps what went wrong lately, for the operator.
	problems problemBook
	// limited notes the Tunnels held to a limit lately, for the operator.
	limited limitWatch
	// egress is what exits may not reach (nil: anything).
	egress *egress.Policy
	// dials keeps how the last connect to each target went.
	dials dialBook
	// openTCP counts the TCP flows in progress, in every role: what a
	// drain waits for (UDP and packet sessions have no end of their own).
	openTCP atomic.Int64
	// limits holds Tunnels to their spec.limits.rateMbps.
	limits rateLimits
	// fair shares each link this relay sends into by Tunnel.
	fair fairShare

	ctx context.Context // ends when the relay closes
	wg  *sync.WaitGroup // the relay's goroutines, waited for by Close
}

func (e *env) manifests() *manifest.Set { return e.set.Load() }

// acquire takes a flow token for a flow of tunnel, from client host at
// an entry (else the zero Addr), or counts the flow refused.
func (e *env) acquire(tunnel string, host netip.Addr) bool {
	tunnelMax := 0
	if t := e.manifests().Tunnel(tunnel); t != nil && t.Spec.Limits != nil {
		tunnelMax = int(t.Spec.Limits.MaxFlows)
	}
	return e.acquireUpTo(tunnel, host, tunnelMax)
}

// acquireUpTo is acquire with the Tunnel's own bound given: 0 for a trace,
// which carries its Chain's key and is no flow of a Tunnel's.
func (e *env) acquireUpTo(tunnel string, host netip.Addr, tunnelMax int) bool {
	if e.draining.Load() {
		e.flowError(tunnel, refusedDraining)
		return false
	}
	if reason := e.flows.take(tunnel, host, tunnelMax); reason != "" {
		e.flowError(tunnel, reason)
		return false
	}
	return true
}

func (e *env) release(tunnel string, host netip.Addr) { e.flows.give(tunnel, host) }

// spawn runs f on a goroutine that Close waits for.
func (e *env) spawn(f func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
}

func (e *env) setupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, e.setupTimeout)
}

// flowCounters are one flow's byte counters, resolved once.
type flowCounters struct {
	up, down flow.Counter
}

// begin counts a flow of a Tunnel in a role; end it with the func returned.
func (e *env) begin(tunnel, role string) (flowCounters, func()) {
	e.m.Flows.WithLabelValues(e.name, tunnel, role).Inc()
	active := e.m.ActiveFlows.WithLabelValues(e.name, tunnel, role)
	active.Inc()
	return flowCounters{
		up:   e.m.Bytes.WithLabelValues(e.name, tunnel, "up"),
		down: e.m.Bytes.WithLabelValues(e.name, tunnel, "down"),
	}, active.Dec
}

// beginTCP is begin for a TCP flow, which a drain waits for.
func (e *env) beginTCP(tunnel, role string) (flowCounters, func()) {
	e.openTCP.Add(1)
	fc, done := e.begin(tunnel, role)
	return fc, func() {
		done()
		e.openTCP.Add(-1)
	}
}

// pace holds a flow's directions to its Tunnel's rate where this relay
// holds them: up at the entry, down at the exit (both where the entry is
// the exit). paced is false for a Tunnel without a limit.
func (e *env) pace(fc flowCounters, t *v1alpha1.Tunnel, up, down bool) (_ flowCounters, paced bool) {
	tr := e.limits.of(t)
	if tr == nil {
		return fc, false
	}
	key := manifest.Key(t.Namespace, t.Name)
	if up {
		fc.up = pacedCounter{fc.up, tr.up, e.m.RateWaited.WithLabelValues(e.name, key, "up")}
	}
	if down {
		fc.down = pacedCounter{fc.down, tr.down, e.m.RateWaited.WithLabelValues(e.name, key, "down")}
	}
	return fc, true
}

// share holds a flow's direction that sends to peer (up at the entry,
// down at the exit, both ways at a middle relay) to its Tunnel's fair
// share of that link (fairShare); release it when the flow ends.
func (e *env) share(c flow.Counter, t *v1alpha1.Tunnel, peer string) (_ flow.Counter, release func()) {
	key := manifest.Key(t.Namespace, t.Name)
	ceiling := 0.0
	if rateLimited(t) {
		ceiling = float64(t.Spec.Limits.RateMbps) * 1e6 / 8
	}
	ft, leave := e.fair.joinWeighted(peer, key, tunnelWeight(t), ceiling, e.m.FairWaited.WithLabelValues(e.name, key, peer))
	p := &fairPacer{Counter: c, t: ft}
	return p, func() {
		p.done()
		leave()
	}
}

// shareDatagrams joins a UDP session's direction that sends to peer to
// its Tunnel's fair share of that link (fairDatagrams); the Share goes to
// the session's options, for a datagram channel's queue. Release it when
// the session ends.
func (e *env) shareDatagrams(t *v1alpha1.Tunnel, peer string) (_ *fairDatagrams, _ *nexthop.Share, release func()) {
	key := manifest.Key(t.Namespace, t.Name)
	ceiling := 0.0
	if rateLimited(t) {
		ceiling = float64(t.Spec.Limits.RateMbps) * 1e6 / 8
	}
	w := tunnelWeight(t)
	ft, leave := e.fair.joinWeighted(peer, key, w, ceiling, e.m.FairWaited.WithLabelValues(e.name, key, peer))
	ft.datagrams.Store(true)
	d := &fairDatagrams{t: ft, over: e.m.UDPDropped.WithLabelValues(e.name, key, "fair_share")}
	return d, &nexthop.Share{Key: key, Weight: w, Dropped: d.lost, Lost: d.lostOnLink}, leave
}

// queueShare names a session's Tunnel to a datagram channel's queue,
// which serves Tunnels in turn, by weight: tun and echo sessions join no
// fair share (their packets are not paced), but without it every Tunnel's
// would share one turn with all the others'.
func queueShare(t *v1alpha1.Tunnel, key string) *nexthop.Share {
	return &nexthop.Share{Key: key, Weight: tunnelWeight(t)}
}

// tunnelWeight is t's spec.limits.weight, 1 when it sets none.
func tunnelWeight(t *v1alpha1.Tunnel) int {
	if t.Spec.Limits != nil && t.Spec.Limits.Weight > 0 {
		return int(t.Spec.Limits.Weight)
	}
	return 1
}

func (e *env) flowError(tunnel, reason string) {
	e.m.FlowErrors.WithLabelValues(e.name, tunnel, reason).Inc()
}

// dialFailed counts and reports a target an exit could not reach: refused
// by the egress policy (egress_refused), or not connected (dial_target).
func (e *env) dialFailed(tunnel, target string, err error) {
	e.dials.record(probe.TargetSpec{Tunnel: tunnel, Target: target}, err)
	if egress.IsRefused(err) {
		e.flowError(tunnel, "egress_refused")
		e.problems.add(adminapi.ProblemEgress, tunnel, fmt.Sprintf("%s: %v", target, err))
		e.warn.Warn("target refused by the egress policy", "tunnel", tunnel, "target", target, "err", err)
		return
	}
	e.flowError(tunnel, "dial_target")
	e.problems.add(adminapi.ProblemDialTarget, tunnel, err.Error())
	e.warn.Warn("cannot connect to target", "tunnel", tunnel, "target", target, "err", err)
}

// hopFailed counts and logs a flow that could not reach its next hop.
func (e *env) hopFailed(tunnel string, err error) {
	reason := nexthop.NextHop
	var he *nexthop.Error
	var nr *noRouteError
	switch {
	case errors.As(err, &nr):
		reason = reasonNoRoute
	case errors.As(err, &he):
		reason = he.Reason
	}
	e.flowError(tunnel, reason)
	if reason == reasonNoRoute {
		e.log.Warn("no route for flow", "tunnel", tunnel, "err", err)
		return
	}
	e.log.Warn("next hop unavailable", "tunnel", tunnel, "err", err)
}

// rejected counts and logs (rate-limited) a stream refused for reason.
func (e *env) rejected(peer string, remote net.Addr, reason string, err error, tunnel string) {
	e.m.Rejected.WithLabelValues(e.name, reason).Inc()
	e.warn.Warn("rejected stream", "peer", peer, "remote", remote, "reason", reason, "tunnel", tunnel, "err", err)
}
