// Package routectl is the route controller: for every routed Chain it
// holds, once per probe interval, it gathers the link measurements of the
// chain's relays, asks relay/route for the cheapest candidate routes,
// measures routes end to end where the mode wants it, and lets a hysteresis
// Selector decide. Entry relays run one for the chains they enter
// (standalone and local mode); the operator runs one for every routed Chain
// of a cluster. Only the Measurer differs: QUIC streams to peers, or HTTPS
// to the relays' admin endpoint.
package routectl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/clock"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/route"
)

// Measurer gathers what a round needs from the relays of a chain.
type Measurer interface {
	// Links returns one relay's measurements for a chain.
	Links(ctx context.Context, req LinksRequest) (*measure.Table, error)
	// Trace measures routes of c end to end, from its entry to its exit and
	// back, through the relays themselves.
	Trace(ctx context.Context, c *v1alpha1.Chain, routes [][]string) ([]measure.Trace, error)
}

// LinksRequest asks a relay of a chain for its table: its links to the
// relays it may forward the chain's flows to and, at the exit, the Tunnels'
// targets, measured within the last Fresh.
type LinksRequest struct {
	Chain *v1alpha1.Chain
	Relay string
	// Through lists the relays that carry the request from the entry to a
	// relay it has no link to of its own; empty to ask directly.
	Through []string
	// Current is the route the chain uses now (nil before the first
	// decision), which the relays learn this way.
	Current []string
	Fresh   time.Duration
}

// Decision is the outcome of one round for one chain.
type Decision struct {
	Chain   string // namespace/name
	Route   []string
	Changed bool
	// Previous is the route before a change.
	Previous []string
	Reason   string
	// Kept says why Route stays although a cheaper candidate exists (see
	// route.Decision); empty otherwise.
	Kept string
	// Estimated and Measured are the route's figures this round; zero when
	// unknown.
	Estimated, Measured time.Duration
	// Candidates are the routes this round priced, best first.
	Candidates []route.Path
	// Transports are the transports the route's relays chose for its
	// links (transport: auto), as their tables said this round.
	Transports []v1alpha1.LinkTransport
	// Unmeasured lists the relays of the chain whose measurements could
	// not be read this round, nor kept from the last two intervals; their
	// links count as down.
	Unmeasured []string
	// Late lists the relays that did not answer in this round's wait and
	// whose table is the one they answered last, within two intervals.
	Late []string
	// Err says why no route could be priced this round; Route is then the
	// one kept from before.
	Err error
}

// Options configure a Controller.
type Options struct {
	Measurer Measurer
	// Decide receives every round's decision, on the chain's goroutine.
	Decide  func(Decision)
	Metrics *metrics.Route
	Log     *slog.Logger
	// Clock times the rounds; the real clock when nil (tests step a fake).
	Clock clock.Clock
}

// Controller routes a set of chains, each on its own goroutine and timer.
type Controller struct {
	o      Options
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	loops map[string]*loop
}

// New makes a controller with no chains.
func New(o Options) *Controller {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	c := &Controller{o: o, loops: map[string]*loop{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Set makes the controller route exactly the routed chains among chains.
// A chain new to it starts from current(chain) (the route in use, or nil):
// that route is kept until a better one wins by the hysteresis margin. A
// chain whose spec changed is measured again at once.
func (c *Controller) Set(chains []*v1alpha1.Chain, current func(*v1alpha1.Chain) []string) {
	want := map[string]bool{}
	for _, ch := range chains {
		if ch.Spec.Mode.Routed() {
			want[manifest.Key(ch.Namespace, ch.Name)] = true
			c.Upsert(ch, current)
		}
	}
	c.mu.Lock()
	var gone []string
	for key := range c.loops {
		if !want[key] {
			gone = append(gone, key)
		}
	}
	c.mu.Unlock()
	for _, key := range gone {
		c.Remove(key)
	}
}

// Upsert starts routing a chain, from current(chain) as Set does, or gives
// its running rounds the chain's new spec. A chain that is not routed (any
// more) is removed.
func (c *Controller) Upsert(ch *v1alpha1.Chain, current func(*v1alpha1.Chain) []string) {
	key := manifest.Key(ch.Namespace, ch.Name)
	if !ch.Spec.Mode.Routed() {
		c.Remove(key)
		return
	}
	ch = ch.DeepCopy()
	ch.Default()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		return
	}
	if l := c.loops[key]; l != nil {
		l.update(ch)
		return
	}
	l := &loop{c: c, key: key, kick: make(chan struct{}, 1), chain: ch, born: c.o.Clock.Now()}
	if r := current(ch); len(r) > 0 && manifest.ValidRoute(ch, r) == nil {
		l.sel.Start(r)
	}
	if mt := c.o.Metrics; mt != nil {
		// At 0 from the start, so that the first route counts as a change
		// in increase() and changes(), and quiet chains have a series.
		mt.Changes.WithLabelValues(key).Add(0)
	}
	var ctx context.Context
	ctx, l.cancel = context.WithCancel(c.ctx)
	c.loops[key] = l
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.run(ctx)
	}()
}

// Remove stops routing a chain (namespace/name), if it was.
func (c *Controller) Remove(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.loops[key]; l != nil {
		l.cancel()
		delete(c.loops, key)
	}
}

// Kick starts a round of every chain now rather than at its next
// interval: a relay went away (it drains), and the chains through it move
// within a round.
func (c *Controller) Kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.loops {
		l.poke()
	}
}

// Close stops every chain's rounds and waits for them.
func (c *Controller) Close() {
	c.cancel()
	c.wg.Wait()
}

type loop struct {
	c    *Controller
	key  string
	kick chan struct{}

	mu     sync.Mutex
	chain  *v1alpha1.Chain
	cancel context.CancelFunc

	born time.Time

	// The loop's goroutine only:
	sel    route.Selector
	cands  []route.Path // the last round's candidates
	book   tableBook    // shared with the link requests a round leaves running
	err    string       // the last failure logged
	failed int          // rounds in a row that found no route
	misses int          // rounds in a row the current route's probe failed
}

func (l *loop) update(ch *v1alpha1.Chain) {
	l.mu.Lock()
	old := l.chain
	l.chain = ch
	l.mu.Unlock()
	if !equality.Semantic.DeepEqual(old.Spec, ch.Spec) {
		l.poke()
	}
}

func (l *loop) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *loop) spec() *v1alpha1.Chain {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chain
}

func (l *loop) run(ctx context.Context) {
	defer l.forget()
	for {
		clk := l.c.o.Clock
		start := clk.Now()
		ch := l.spec()
		d := l.round(ctx, ch)
		if ctx.Err() != nil {
			return
		}
		l.report(d)
		next := Interval(ch)
		switch {
		case d.Err != nil && len(d.Route) == 0:
			// No route yet, usually because the relays' connections are
			// still coming up: try again soon rather than a whole interval
			// later, while new flows wait.
			next = min(next, firstRetry)
		case l.sel.Challenged():
			// A better route won this round: confirm it sooner, so that a
			// route that degraded is left within two intervals of the change
			// even counting the time a round takes to measure.
			next /= 2
		}
		t := clk.NewTimer(next - clk.Since(start))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		case <-l.kick:
			t.Stop()
		}
	}
}

// Interval is a routed chain's probe interval.
func Interval(ch *v1alpha1.Chain) time.Duration {
	if p := ch.Spec.Probe; p != nil && p.Interval != nil && p.Interval.Duration > 0 {
		return p.Interval.Duration
	}
	return v1alpha1.DefaultProbeInterval
}

// ProbeWait is how long a relay waits for the answers to a round of link
// probes of a chain probed every interval. A round of the controller waits
// for the relays' tables a little longer, then for end-to-end probes, and
// ends within the interval.
func ProbeWait(interval time.Duration) time.Duration {
	return min(max(interval*35/100, 50*time.Millisecond), 5*time.Second)
}

// firstRetry spaces the rounds of a chain that has no route yet.
const firstRetry = 200 * time.Millisecond

// quietFailures is how many rounds in a row may find no route before it is
// logged: a relay's first rounds run while its connections come up.
const quietFailures = 3

func tablesWait(interval time.Duration) time.Duration { return interval * 60 / 100 }
func pipeWait(interval time.Duration) time.Duration   { return interval * 35 / 100 }

// roundWait bounds all the waiting of a round, so that it ends within its
// interval whatever its measurer does: a measurer's call may end some time
// after its context (a busy host, a stream reset that is slow to land), and
// the round does not wait for it.
func roundWait(interval time.Duration) time.Duration { return interval * 95 / 100 }

func hysteresis(ch *v1alpha1.Chain) route.Hysteresis {
	h := route.DefaultHysteresis
	if s := ch.Spec.Hysteresis; s != nil {
		if s.Percent != nil {
			h.Fraction = float64(*s.Percent) / 100
		}
		if s.Min != nil {
			h.Min = s.Min.Duration
		}
		if s.Rounds > 0 {
			h.Rounds = int(s.Rounds)
		}
	}
	return h
}

func mode(ch *v1alpha1.Chain) route.Mode {
	if ch.Spec.Mode == v1alpha1.ModePipe {
		return route.Pipe
	}
	return route.Sum
}

// round measures the chain and decides its route, within roundWait of
// the interval: it waits for tables until tablesWait, for traces until
// pipeWait after they start, and for nothing past roundWait; what answered
// by then is what it decides on.
func (l *loop) round(ctx context.Context, ch *v1alpha1.Chain) Decision {
	m := l.c.o.Measurer
	interval := Interval(ch)
	start := time.Now() // contexts' deadlines are on the real clock
	end := start.Add(roundWait(interval))
	l.sel.H = hysteresis(ch)
	if cur := l.sel.Current(); cur != nil {
		if err := manifest.ValidRoute(ch, cur); err != nil {
			l.sel.Drop(fmt.Sprintf("the spec no longer allows it: %v", err))
		}
	}
	current := l.sel.Current()

	// The routes probed last round are probed again while the tables are
	// read: usually they are this round's too, and the round takes the
	// longer of the two, not their sum. Routes new to the set follow.
	md := mode(ch)
	measured := map[string]time.Duration{}
	var mmu sync.Mutex
	closed := false // set once the round ranks: later results are dropped
	probeRoutes := func(routes [][]string, until time.Time) <-chan struct{} {
		done := make(chan struct{})
		if len(routes) == 0 {
			close(done)
			return done
		}
		go func() {
			defer close(done)
			pctx, cancel := context.WithDeadline(ctx, until)
			defer cancel()
			results, err := m.Trace(pctx, ch, routes)
			if err != nil {
				return
			}
			mmu.Lock()
			defer mmu.Unlock()
			if closed {
				return
			}
			for _, r := range results {
				if r.Err == "" && r.RTT > 0 {
					measured[route.Key(r.Route)] = r.RTT.D()
				}
			}
		}()
		return done
	}
	early := route.ToMeasure(md, l.cands, current)
	earlyUntil := start.Add(pipeWait(interval))
	earlyDone := probeRoutes(early, earlyUntil)

	g, chosen, unmeasured, late, down, tableErr := l.gather(ctx, start.Add(tablesWait(interval)), ch, current, interval)
	d := Decision{Chain: l.key, Unmeasured: unmeasured, Late: late}
	cands := route.Candidates(g, route.Request{Entry: ch.Spec.Entry, Exit: ch.Spec.Exit, Via: ch.Spec.Via, MaxHops: int(ch.Spec.MaxHops)},
		int(candidates(ch)))
	l.cands = cands
	waitUntil(ctx, earlyDone, earlyUntil)
	var fresh [][]string
	for _, r := range route.ToMeasure(md, cands, current) {
		if !slices.ContainsFunc(early, func(e []string) bool { return slices.Equal(e, r) }) {
			fresh = append(fresh, r)
		}
	}
	if !slices.Contains(unmeasured, ch.Spec.Entry) {
		until := time.Now().Add(pipeWait(interval))
		if until.After(end) {
			until = end
		}
		waitUntil(ctx, probeRoutes(fresh, until), until)
	}
	mmu.Lock()
	closed = true // measured is the round's from here on
	mmu.Unlock()
	ranked, cost, ok := route.Rank(md, g, cands, measured, current)
	if current == nil && len(unmeasured)+len(down) > 0 && l.c.o.Clock.Since(l.born) < max(interval, time.Second) {
		// A chain's first round often runs while its relays' connections
		// come up: wait a little for all of them, and for every link
		// between them, rather than take the one route measured so far
		// and change it a moment later.
		d.Candidates = ranked
		d.Err = fmt.Errorf("waiting for relays %v and links %v before the first route", unmeasured, down)
		return d
	}
	var sd route.Decision
	if l.probeMissed(md, g, measured, current, ok) {
		// Its links answer, but its end-to-end probe did not (lost, or late
		// on a busy host): once is no reason to move, twice in a row is.
		sd = route.Decision{Route: current}
	} else {
		sd = l.sel.Next(ranked, cost, ok)
	}
	if sd.Changed && !ok && len(current) > 0 {
		sd.Reason = fmt.Sprintf("route %v is broken: %s", current, brokenPart(md, g, current, unmeasured, down))
	}
	d.Route, d.Changed, d.Reason, d.Kept, d.Candidates = sd.Route, sd.Changed, sd.Reason, sd.Kept, ranked
	if sd.Changed {
		d.Previous = current
	}
	if len(d.Route) > 0 {
		p, _ := route.Price(md, g, measured, d.Route)
		d.Estimated, d.Measured = p.Estimated, p.Measured
	}
	if ch.Spec.Transport == v1alpha1.TransportAuto {
		for i := 1; i < len(d.Route); i++ {
			if lt, ok := chosen[[2]string{d.Route[i-1], d.Route[i]}]; ok {
				d.Transports = append(d.Transports, lt)
			}
		}
	}
	if len(ranked) == 0 {
		d.Err = noRoute(ch, md, unmeasured, tableErr)
	}
	return d
}

// waitUntil waits for done, until the deadline or ctx's end.
func waitUntil(ctx context.Context, done <-chan struct{}, deadline time.Time) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	select {
	case <-done:
	case <-wctx.Done():
	}
}

// probeMissed reports a pipe-mode current route that could not be priced
// only because its end-to-end probe failed, for the first round in a row.
func (l *loop) probeMissed(md route.Mode, g *route.Graph, measured map[string]time.Duration, current []string, priced bool) bool {
	_, linksUp := g.Cost(current)
	_, probed := measured[route.Key(current)]
	if md != route.Pipe || priced || current == nil || !linksUp || probed {
		l.misses = 0
		return false
	}
	l.misses++
	return l.misses < 2
}

// gather reads the tables of the chain's relays into a graph: first from
// every relay directly, then, for relays that could not be reached so,
// through relays whose tables show a link to them, until wait. A relay
// that has not answered by then adds the table it answered last, if that
// came within keepTable (it is late), or no links (it is unmeasured):
// routes through it cannot be priced, and one that has died shows anyway
// in the links toward it, which its peers' probes find down (listed in
// down). Requests not answered by wait go on (see tableBook).
func (l *loop) gather(ctx context.Context, wait time.Time, ch *v1alpha1.Chain, current []string, interval time.Duration) (
	g *route.Graph, chosen map[[2]string]v1alpha1.LinkTransport, unmeasured, late, down []string, err error) {
	wctx, cancel := context.WithDeadline(ctx, wait)
	defer cancel()
	g = &route.Graph{}
	chosen = map[[2]string]v1alpha1.LinkTransport{}
	add := func(relay string, t *measure.Table) {
		for _, link := range t.Links {
			switch {
			case link.Up:
				g.SetLink(relay, link.To, link.RTT.D())
			case link.Draining:
				down = append(down, relay+" -> "+link.To+" (draining)")
			default:
				down = append(down, relay+" -> "+link.To)
			}
			if link.Transport != "" {
				chosen[[2]string{relay, link.To}] = v1alpha1.LinkTransport{From: relay, To: link.To,
					Transport: v1alpha1.Transport(link.Transport), Reason: link.TransportReason}
			}
		}
		if relay == ch.Spec.Exit {
			g.SetTarget(relay, targetRTT(t.Targets))
		}
	}
	relays := manifest.Measured(ch)
	l.book.retain(func(r string) bool { return slices.Contains(relays, r) })
	answered := map[string]bool{}
	why := map[string]error{} // the last failure of each relay
	// ask sends (or finds in flight) a request to each relay, waits for
	// them until wait, and returns those whose request failed.
	ask := func(rs []string, through func(string) []string) (failed []string) {
		asks := make([]*tableAsk, len(rs))
		for i, r := range rs {
			req := LinksRequest{Chain: ch, Relay: r, Through: through(r), Current: current, Fresh: interval / 4}
			asks[i] = l.book.ask(ctx, r, askTimeout(interval), l.c.o.Clock.Now, func(actx context.Context) (*measure.Table, error) {
				return l.c.o.Measurer.Links(actx, req)
			})
		}
		for _, a := range asks {
			select {
			case <-a.done:
			case <-wctx.Done():
			}
		}
		for i, r := range rs {
			select {
			case <-asks[i].done:
			default:
				why[r] = fmt.Errorf("link table of %s: no answer within %v", r, tablesWait(interval))
				continue
			}
			if asks[i].err != nil || asks[i].t == nil {
				why[r] = asks[i].err
				failed = append(failed, r)
				continue
			}
			add(r, asks[i].t)
			answered[r] = true
		}
		return failed
	}
	failed := ask(relays, func(string) []string { return nil })
	// Then, phase by phase, the relays that failed, through the relays
	// that answered and have a link toward them. Each phase reaches at
	// least one more relay or is the last.
	for len(failed) > 0 && wctx.Err() == nil && answered[ch.Spec.Entry] {
		through := slices.DeleteFunc(slices.Clone(ch.Spec.Via), func(v string) bool { return !answered[v] })
		paths := map[string][]string{}
		var again, unreachable []string
		for _, r := range failed {
			if p := route.Reach(g, ch.Spec.Entry, r, through); len(p) > 2 {
				paths[r] = p[1 : len(p)-1]
				again = append(again, r)
			} else {
				unreachable = append(unreachable, r)
			}
		}
		if len(again) == 0 {
			break
		}
		before := len(answered)
		still := ask(again, func(r string) []string { return paths[r] })
		if len(answered) == before {
			break
		}
		failed = append(unreachable, still...)
	}
	now := l.c.o.Clock.Now()
	var errs []error
	for _, r := range relays {
		switch t := l.book.kept(r, now, keepTable(interval)); {
		case answered[r]:
		case t != nil:
			add(r, t)
			late = append(late, r)
		default:
			unmeasured = append(unmeasured, r)
			if why[r] != nil {
				errs = append(errs, why[r])
			}
		}
	}
	return g, chosen, unmeasured, late, down, errors.Join(errs...)
}

func noRoute(ch *v1alpha1.Chain, md route.Mode, unmeasured []string, err error) error {
	what := "no route from %s to %s could be priced"
	if md == route.Pipe {
		what = "no route from %s to %s could be measured end to end"
	}
	msg := fmt.Sprintf(what, ch.Spec.Entry, ch.Spec.Exit)
	if len(unmeasured) > 0 {
		msg += fmt.Sprintf("; relays not answering: %v", unmeasured)
	}
	if err != nil {
		msg += fmt.Sprintf(" (%v)", err)
	}
	return errors.New(msg)
}

func candidates(ch *v1alpha1.Chain) int32 {
	if p := ch.Spec.Probe; p != nil && p.Candidates > 0 {
		return p.Candidates
	}
	return v1alpha1.DefaultProbeCandidates
}

// targetRTT is the chain's round trip from the exit to its targets: the mean
// over the targets that answered. It is the same for every route of the
// chain, so it moves the figures, not the choice.
func targetRTT(ts []measure.Target) time.Duration {
	var sum time.Duration
	n := 0
	for _, t := range ts {
		if t.Up {
			sum += t.RTT.D()
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

func (l *loop) report(d Decision) {
	o := l.c.o
	if mt := o.Metrics; mt != nil {
		result := "decided"
		if d.Err != nil {
			result = "failed"
		}
		mt.Rounds.WithLabelValues(d.Chain, result).Inc()
		setOrDelete(mt, d.Chain, "estimated", d.Estimated)
		setOrDelete(mt, d.Chain, "measured", d.Measured)
		if d.Changed {
			mt.Changes.WithLabelValues(d.Chain).Inc()
		}
	}
	if d.Err != nil {
		l.failed++
	} else {
		l.failed = 0
	}
	if o.Log.Enabled(context.Background(), slog.LevelDebug) {
		var cands []string
		for _, c := range d.Candidates {
			cands = append(cands, fmt.Sprintf("%s=%v/%v", route.Key(c.Relays), c.Estimated.Round(10*time.Microsecond), c.Measured.Round(10*time.Microsecond)))
		}
		o.Log.Debug("route round", "chain", d.Chain, "route", route.Key(d.Route), "candidates", cands, "unmeasured", d.Unmeasured, "late", d.Late, "err", d.Err)
	}
	switch {
	case d.Changed:
		o.Log.Info("route changed", "chain", d.Chain, "from", route.Key(d.Previous), "to", route.Key(d.Route),
			"estimated", d.Estimated.Round(10*time.Microsecond), "measured", d.Measured.Round(10*time.Microsecond), "reason", d.Reason)
	case d.Err != nil && l.failed >= quietFailures && d.Err.Error() != l.err:
		o.Log.Warn("cannot route chain", "chain", d.Chain, "keeping", route.Key(d.Route), "err", d.Err)
		l.err = d.Err.Error()
	case d.Err == nil && l.err != "":
		o.Log.Info("chain measured again", "chain", d.Chain, "route", route.Key(d.Route))
		l.err = ""
	}
	if o.Decide != nil {
		o.Decide(d)
	}
}

func setOrDelete(mt *metrics.Route, chain, kind string, v time.Duration) {
	if v > 0 {
		mt.Latency.WithLabelValues(chain, kind).Set(v.Seconds())
	} else {
		mt.Latency.DeleteLabelValues(chain, kind)
	}
}

// forget drops a chain's series when the controller stops routing it.
func (l *loop) forget() {
	mt := l.c.o.Metrics
	if mt == nil {
		return
	}
	mt.Latency.DeleteLabelValues(l.key, "estimated")
	mt.Latency.DeleteLabelValues(l.key, "measured")
	mt.Changes.DeleteLabelValues(l.key)
	mt.Rounds.DeleteLabelValues(l.key, "decided")
	mt.Rounds.DeleteLabelValues(l.key, "failed")
}

// brokenPart says what breaks route this round, naming the relay or link:
// a relay that did not answer, a link down (a relay that drains says so:
// a planned stop, not a failure), a link not measured, or in pipe mode an
// end-to-end probe that failed.
func brokenPart(md route.Mode, g *route.Graph, rt, unmeasured, down []string) string {
	var parts []string
	for _, r := range rt {
		if slices.Contains(unmeasured, r) {
			parts = append(parts, fmt.Sprintf("relay %s did not answer (down, or unreachable)", r))
		}
	}
	for i := 0; i+1 < len(rt); i++ {
		if _, ok := g.Link(rt[i], rt[i+1]); ok {
			continue
		}
		link := rt[i] + " -> " + rt[i+1]
		switch {
		case slices.Contains(down, link+" (draining)"):
			parts = append(parts, fmt.Sprintf("relay %s drains (link %s)", rt[i+1], link))
		case slices.Contains(down, link):
			parts = append(parts, fmt.Sprintf("link %s is down (%s does not answer its probes)", link, rt[i+1]))
		case !slices.Contains(unmeasured, rt[i]):
			parts = append(parts, fmt.Sprintf("link %s is not measured", link))
		}
	}
	if len(parts) == 0 && md == route.Pipe {
		parts = append(parts, "its end-to-end probe failed")
	}
	if len(parts) == 0 {
		return "it could not be priced this round"
	}
	return strings.Join(parts, "; ")
}
