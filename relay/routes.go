package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/logs"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/route"
	"github.com/hoplink/hoplink/routectl"
)

// routeBook is what a relay knows of its chains' routes, and the one
// answer to "which route do new flows of this chain take". Flows carry
// their route in their header and every relay accepts any route the
// chain's spec allows, so a new route needs no coordination: new flows
// take it, open ones finish where they started.
type routeBook struct {
	*env
	// links is what this relay's link layer knows of its peers now; it is
	// asked, never asks back.
	links linkState
	// self: this relay routes the routed chains it enters (standalone and
	// local mode); else it follows the routes in the Chains' status.
	self bool

	mu sync.Mutex
	// decided holds the routes this relay chose for the chains it enters.
	decided map[string][]string
	// learned holds the routes entry relays announced with their link
	// requests, for the chains this relay serves but does not enter.
	learned map[string][]string
	// exported is the route label each chain has in hoplink_chain_route_info.
	exported map[string]string
	// standIns is the candidate each chain's flows take while the
	// operator's route is broken, as last logged.
	standIns map[string]string
	// changed is closed and replaced whenever a route may have changed.
	changed chan struct{}
	// rounds holds the last decision for each chain this relay routes,
	// and when its route last changed, for the status.
	rounds map[string]round
}

// linkState is what route choice asks the link layer: read-only questions
// about the relays it links to (nexthop.Peers).
type linkState interface {
	// Draining: the relay said it takes no new flows.
	Draining(relay string) bool
	// Down: this relay's link to it is known down now.
	Down(relay string) bool
	// Lost: its connection is known lost (timed out, a dial failed); a
	// probe round unanswered over a live connection is not.
	Lost(relay string) bool
}

type round struct {
	d       routectl.Decision
	changed time.Time
}

func newRouteBook(e *env, self bool, links linkState) *routeBook {
	return &routeBook{env: e, self: self, links: links, decided: map[string][]string{}, learned: map[string][]string{},
		exported: map[string]string{}, standIns: map[string]string{}, changed: make(chan struct{}), rounds: map[string]round{}}
}

func (b *routeBook) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// errNoRoute is a flow of a routed chain that found no route in time.
var errNoRoute = errors.New("the chain has no route yet")

// errChainGone is a flow whose Tunnel's Chain left the manifests.
var errChainGone = errors.New("the Tunnel's chain is gone")

// avoidedError is a route refused because it crosses a relay that the
// caller's avoid names (it drains, or does not answer).
type avoidedError struct{ error }

// reasonNoRoute is the reason label of hoplink_flow_errors_total of a
// flow that found no route (a noRouteError).
const reasonNoRoute = "no_route"

// noRouteError is a flow that found no route to take.
type noRouteError struct{ err error }

func (e *noRouteError) Error() string { return e.err.Error() }

func (e *noRouteError) Unwrap() error { return e.err }

// routeOf returns the chain and the route a new flow of Tunnel t takes,
// avoiding the relays the link layer knows are unavailable.
func (b *routeBook) routeOf(ctx context.Context, t *v1alpha1.Tunnel) (*v1alpha1.Chain, []string, error) {
	chain := b.manifests().ChainOf(t)
	if chain == nil {
		return nil, nil, &noRouteError{errChainGone}
	}
	rt, err := b.Route(ctx, chain, b.unavailable)
	if errors.As(err, new(avoidedError)) {
		// No route avoids a relay that drains or a next hop that answered
		// no probe of the last round. Silence over a connection that stays
		// up (probes dropped in a full queue, answers late on a busy host)
		// may well carry the flow: refusing would reset every new flow of
		// the path until the next round. A next hop whose connection is
		// lost is refused at once, as before.
		if alt, altErr := b.Route(ctx, chain, b.unreachable); altErr == nil {
			rt, err = alt, nil
		}
	}
	if err != nil {
		return nil, nil, &noRouteError{err}
	}
	return chain, rt, nil
}

// unreachable is unavailable without a next hop's silence: a relay that
// drains, or a next hop whose connection is known lost.
func (b *routeBook) unreachable(relay string, next bool) bool {
	return b.links.Draining(relay) || (next && b.links.Lost(relay))
}

// unavailable reports a relay new flows should not be sent through: it
// drains, or, as this relay's next hop, it stopped answering. That this
// relay cannot reach a relay further on says nothing of the route: the
// relay before that one reaches it (a link cut between two relays).
func (b *routeBook) unavailable(relay string, next bool) bool {
	return b.links.Draining(relay) || (next && b.links.Down(relay))
}

// Route returns the route new flows of chain c take. A routed chain
// without one yet (its first round is under way) is waited for until ctx
// ends. A route through a relay that avoid names (it drains, or is
// down) is not taken: a chain this relay routes waits at most a round for another (the
// news of the drain starts one), any other fails at once.
func (b *routeBook) Route(ctx context.Context, c *v1alpha1.Chain, avoid func(relay string, next bool) bool) ([]string, error) {
	key := manifest.Key(c.Namespace, c.Name)
	var reroute <-chan time.Time
	for {
		b.mu.Lock()
		routing := b.self && c.Spec.Mode.Routed()
		var rt []string
		if routing {
			rt = b.decided[key]
		} else {
			rt = manifest.Route(c)
		}
		changed := b.changed
		b.mu.Unlock()
		if bad := crossing(rt, avoid); bad != "" {
			if !routing && c.Spec.Mode.Routed() {
				// The operator routes this chain, and its route is broken
				// where this relay can see: until it routes again (it may
				// be down too), take the best of its last candidates that
				// avoids what this relay knows is gone.
				if alt := standIn(c, avoid); alt != nil {
					b.standingIn(key, rt, alt, bad)
					return alt, nil
				}
				return nil, avoidedError{fmt.Errorf("relay %s of the chain's route drains (shuts down) or does not answer, and no candidate in the chain's status avoids it", bad)}
			}
			if !routing {
				return nil, avoidedError{fmt.Errorf("relay %s of the chain's route drains (shuts down) or does not answer, and the route is fixed", bad)}
			}
			if reroute == nil {
				t := time.NewTimer(routectl.Interval(c))
				defer t.Stop()
				reroute = t.C
			}
			rt = nil
		}
		if len(rt) > 0 {
			return rt, nil
		}
		select {
		case <-changed:
			c = b.manifests().Chain(key)
			if c == nil {
				return nil, fmt.Errorf("chain %q is gone", key)
			}
		case <-reroute:
			return nil, avoidedError{errors.New("every route of the chain crosses a relay that drains (shuts down) or does not answer")}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", errNoRoute, context.Cause(ctx))
		}
	}
}

// standIn is the first of a routed chain's status candidates (best first)
// that the spec allows and that crosses no relay avoid names.
func standIn(c *v1alpha1.Chain, avoid func(relay string, next bool) bool) []string {
	for _, cand := range c.Status.Candidates {
		if manifest.ValidRoute(c, cand.Route) == nil && crossing(cand.Route, avoid) == "" {
			return cand.Route
		}
	}
	return nil
}

// standingIn logs, once per change, that flows of a chain take a stand-in
// for the operator's broken route.
func (b *routeBook) standingIn(chain string, broken, alt []string, bad string) {
	label := strings.Join(alt, ",")
	b.mu.Lock()
	same := b.standIns[chain] == label
	b.standIns[chain] = label
	b.mu.Unlock()
	if !same {
		b.log.Warn("the chain's route is broken; new flows take the best other candidate until the operator routes again",
			"chain", chain, "route", logs.Route(broken), "unavailable", bad, "stand_in", logs.Route(alt))
	}
}

// crossing is the first relay after the entry of rt that avoid names; next
// tells avoid whether the relay is this one's next hop (what this relay
// knows of its own links, it knows only of that one).
func crossing(rt []string, avoid func(relay string, next bool) bool) string {
	if avoid == nil || len(rt) < 2 {
		return ""
	}
	for i, r := range rt[1:] {
		if avoid(r, i == 0) {
			return r
		}
	}
	return ""
}

// update applies a new manifest set: routes the changed specs no longer
// allow are forgotten (new flows wait for the round the change starts).
func (b *routeBook) update(set *manifest.Set) {
	b.mu.Lock()
	for key := range b.learned {
		if c := set.Chain(key); c == nil || !c.Spec.Mode.Routed() {
			delete(b.learned, key)
		}
	}
	for key, rt := range b.decided {
		if c := set.Chain(key); c == nil || !c.Spec.Mode.Routed() || c.Spec.Entry != b.name || manifest.ValidRoute(c, rt) != nil {
			delete(b.decided, key)
		}
	}
	for key := range b.rounds {
		if _, ok := b.decided[key]; !ok {
			delete(b.rounds, key)
		}
	}
	b.notifyLocked()
	b.mu.Unlock()
	b.export(set)
}

// current is the route a chain this relay routes starts from: its last
// decision, else the route the user wrote, which serves until the first.
func (b *routeBook) current(c *v1alpha1.Chain) []string {
	key := manifest.Key(c.Namespace, c.Name)
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.decided[key]; len(d) > 0 {
		return d
	}
	if len(c.Spec.Route) > 0 {
		b.decided[key] = c.Spec.Route
		b.notifyLocked()
	}
	return c.Spec.Route
}

// decide takes the route controller's decision for a chain this relay enters.
func (b *routeBook) decide(d routectl.Decision) {
	if len(d.Route) == 0 {
		return
	}
	b.mu.Lock()
	prev := b.rounds[d.Chain]
	r := round{d: d, changed: prev.changed}
	if r.d.Reason == "" {
		// A round gives a reason only when it changes the route; the
		// status says why the route is what it is: the last change's.
		r.d.Reason = prev.d.Reason
	}
	if !slices.Equal(b.decided[d.Chain], d.Route) {
		b.decided[d.Chain] = d.Route
		r.changed = time.Now()
		b.notifyLocked()
	}
	b.rounds[d.Chain] = r
	b.mu.Unlock()
	b.export(b.manifests())
}

// learn takes the route an entry announced with its link request.
func (b *routeBook) learn(chain string, rt []string) {
	b.mu.Lock()
	old := b.learned[chain]
	b.learned[chain] = rt
	b.mu.Unlock()
	if !slices.Equal(old, rt) {
		b.export(b.manifests())
	}
}

// export sets hoplink_chain_route_info for every chain this relay is a
// member of, to the route it knows new flows take.
func (b *routeBook) export(set *manifest.Set) {
	g := b.m.ChainRoute
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := map[string]bool{}
	for _, c := range set.Chains {
		if !slices.Contains(manifest.Members(c), b.name) {
			continue
		}
		key := manifest.Key(c.Namespace, c.Name)
		cur := b.knownLocked(c)
		if len(cur) == 0 {
			continue
		}
		seen[key] = true
		label := route.Key(cur)
		if old, ok := b.exported[key]; ok && old != label {
			g.DeleteLabelValues(b.name, key, old)
		}
		b.exported[key] = label
		g.WithLabelValues(b.name, key, label).Set(1)
	}
	for key, label := range b.exported {
		if !seen[key] {
			g.DeleteLabelValues(b.name, key, label)
			delete(b.exported, key)
		}
	}
}

// knownLocked is the route this relay knows new flows of c take: its own
// decision, the one its entry announced, or the spec's (or status') route.
func (b *routeBook) knownLocked(c *v1alpha1.Chain) []string {
	key := manifest.Key(c.Namespace, c.Name)
	switch {
	case b.self && c.Spec.Mode.Routed() && c.Spec.Entry == b.name:
		return b.decided[key]
	case b.self && c.Spec.Mode.Routed():
		return b.learned[key]
	}
	return manifest.Route(c)
}

// known is knownLocked for callers without the lock.
func (b *routeBook) known(c *v1alpha1.Chain) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.knownLocked(c)
}

// lastRound is the last decision for chain and when its route changed.
func (b *routeBook) lastRound(chain string) (routectl.Decision, time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.rounds[chain]
	return r.d, r.changed, ok
}
