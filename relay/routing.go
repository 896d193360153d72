package relay

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/probe"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/route"
	"github.com/hoplink/hoplink/routectl"
)

// Routing in a relay. Every relay probes the links it may forward on (in
// the background, and whenever a route controller asks) and, as the exit of
// a routed chain, its Tunnels' targets. A route controller reads those
// measurements: the operator over the relays' admin endpoint, or, in
// standalone and local mode, the entry relay of each routed chain, which
// asks its peers over QUIC (a KindLinks stream) and routes the chain itself.
// Either way flows carry their route in their header and every relay
// accepts any route the chain's spec allows, so a new route needs no
// coordination: new flows take it, open ones finish where they started.

// routes is what a relay knows of its chains' routes.
type routes struct {
	mu sync.Mutex
	// decided holds the routes this relay chose for the chains it enters
	// (standalone and local mode).
	decided map[string][]string
	// learned holds the routes entry relays announced with their link
	// requests, for the chains this relay serves but does not enter.
	learned map[string][]string
	// exported is the route label each chain has in hoplink_chain_route_info.
	exported map[string]string
	// changed is closed and replaced whenever a route may have changed.
	changed chan struct{}
}

func newRoutes() *routes {
	return &routes{decided: map[string][]string{}, learned: map[string][]string{}, exported: map[string]string{}, changed: make(chan struct{})}
}

func (rs *routes) notifyLocked() {
	close(rs.changed)
	rs.changed = make(chan struct{})
}

// errNoRoute is a flow of a routed chain that found no route in time.
var errNoRoute = errors.New("the chain has no route yet")

// routeOf returns the route new flows of chain c take. A routed chain
// without one yet (its first round is under way) is waited for until ctx
// ends.
func (r *Relay) routeOf(ctx context.Context, c *v1alpha1.Chain) ([]string, error) {
	key := manifest.Key(c.Namespace, c.Name)
	for {
		r.routes.mu.Lock()
		var route []string
		if r.cfg.Route && c.Spec.Mode.Routed() {
			route = r.routes.decided[key]
		} else {
			route = manifest.Route(c)
		}
		changed := r.routes.changed
		r.routes.mu.Unlock()
		if len(route) > 0 {
			return route, nil
		}
		select {
		case <-changed:
			c = r.set.Load().Chain(key)
			if c == nil {
				return nil, fmt.Errorf("chain %q is gone", key)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", errNoRoute, context.Cause(ctx))
		}
	}
}

// startRouting starts the background prober and, when the relay routes
// its own chains, the route controller.
func (r *Relay) startRouting() {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.probeLoop()
	}()
	if r.cfg.Route {
		r.ctl = routectl.New(routectl.Options{
			Measurer: (*relayMeasurer)(r),
			Decide:   r.decide,
			Metrics:  r.cfg.Metrics.Route,
			Log:      r.cfg.Log,
		})
	}
	r.routingUpdated(r.set.Load())
}

// routingUpdated applies a new manifest set to routing: the chains this
// relay routes, and the routes it exports.
func (r *Relay) routingUpdated(set *manifest.Set) {
	r.routes.mu.Lock()
	for key := range r.routes.learned {
		if c := set.Chain(key); c == nil || !c.Spec.Mode.Routed() {
			delete(r.routes.learned, key)
		}
	}
	for key, route := range r.routes.decided {
		// A route the changed spec no longer allows would be refused by the
		// next relay; new flows wait for the round the change starts.
		if c := set.Chain(key); c == nil || !c.Spec.Mode.Routed() || c.Spec.Entry != r.cfg.Name || manifest.ValidRoute(c, route) != nil {
			delete(r.routes.decided, key)
		}
	}
	r.routes.notifyLocked()
	r.routes.mu.Unlock()
	if r.ctl != nil {
		var mine []*v1alpha1.Chain
		for _, c := range set.Chains {
			if c.Spec.Entry == r.cfg.Name {
				mine = append(mine, c)
			}
		}
		r.ctl.Set(mine, func(c *v1alpha1.Chain) []string {
			key := manifest.Key(c.Namespace, c.Name)
			r.routes.mu.Lock()
			defer r.routes.mu.Unlock()
			if d := r.routes.decided[key]; len(d) > 0 {
				return d
			}
			// The route the user wrote serves until the first decision.
			if len(c.Spec.Route) > 0 {
				r.routes.decided[key] = c.Spec.Route
				r.routes.notifyLocked()
			}
			return c.Spec.Route
		})
	}
	r.exportRoutes(set)
}

// decide takes the route controller's decision for a chain this relay enters.
func (r *Relay) decide(d routectl.Decision) {
	if len(d.Route) == 0 {
		return
	}
	r.routes.mu.Lock()
	if !slices.Equal(r.routes.decided[d.Chain], d.Route) {
		r.routes.decided[d.Chain] = d.Route
		r.routes.notifyLocked()
	}
	r.routes.mu.Unlock()
	r.exportRoutes(r.set.Load())
}

// exportRoutes sets hoplink_chain_route_info for every chain this relay is
// a member of, to the route it knows new flows take.
func (r *Relay) exportRoutes(set *manifest.Set) {
	g := r.cfg.Metrics.ChainRoute
	r.routes.mu.Lock()
	defer r.routes.mu.Unlock()
	seen := map[string]bool{}
	for _, c := range set.Chains {
		if !slices.Contains(manifest.Members(c), r.cfg.Name) {
			continue
		}
		key := manifest.Key(c.Namespace, c.Name)
		var cur []string
		switch {
		case r.cfg.Route && c.Spec.Mode.Routed() && c.Spec.Entry == r.cfg.Name:
			cur = r.routes.decided[key]
		case r.cfg.Route && c.Spec.Mode.Routed():
			cur = r.routes.learned[key]
		default:
			cur = manifest.Route(c)
		}
		if len(cur) == 0 {
			continue
		}
		seen[key] = true
		label := route.Key(cur)
		if old, ok := r.routes.exported[key]; ok && old != label {
			g.DeleteLabelValues(r.cfg.Name, key, old)
		}
		r.routes.exported[key] = label
		g.WithLabelValues(r.cfg.Name, key, label).Set(1)
	}
	for key, label := range r.routes.exported {
		if !seen[key] {
			g.DeleteLabelValues(r.cfg.Name, key, label)
			delete(r.routes.exported, key)
		}
	}
}

// probeInterval is how often this relay probes in the background: the
// shortest probe interval of the routed chains it is part of.
func (r *Relay) probeInterval(set *manifest.Set) time.Duration {
	every := v1alpha1.DefaultProbeInterval
	for _, c := range set.Chains {
		if c.Spec.Mode.Routed() && slices.Contains(manifest.Members(c), r.cfg.Name) {
			every = min(every, routectl.Interval(c))
		}
	}
	return every
}

// probeLoop keeps the measurements of every link the relay may forward on,
// and of the targets of the routed chains it ends, at most an interval old,
// so metrics stay current when no route controller asks.
func (r *Relay) probeLoop() {
	for {
		set := r.set.Load()
		every := r.probeInterval(set)
		peers := set.NextHops(r.cfg.Name)
		var targets []probe.TargetSpec
		for _, c := range set.Chains {
			if c.Spec.Mode.Routed() && c.Spec.Exit == r.cfg.Name {
				targets = append(targets, r.targetSpecs(set, c)...)
			}
		}
		r.links.Retain(peers)
		r.targets.Retain(targets)
		ctx, cancel := context.WithTimeout(r.ctx, routectl.ProbeWait(every))
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); r.links.Measure(ctx, peers, every/2) }()
		go func() { defer wg.Done(); r.targets.Measure(ctx, targets, every/2) }()
		wg.Wait()
		cancel()
		select {
		case <-time.After(every):
		case <-r.ctx.Done():
			return
		}
	}
}

// targetSpecs lists the TCP targets of a chain's Tunnels; UDP targets have
// no connect to time.
func (r *Relay) targetSpecs(set *manifest.Set, c *v1alpha1.Chain) []probe.TargetSpec {
	var out []probe.TargetSpec
	for _, t := range set.Tunnels {
		if t.Namespace == c.Namespace && t.Spec.Chain == c.Name && t.Spec.Protocol == v1alpha1.ProtocolTCP {
			out = append(out, probe.TargetSpec{Tunnel: manifest.Key(t.Namespace, t.Name), Target: t.Spec.Target})
		}
	}
	return out
}

// LinkTable measures this relay's part of a routed chain: its links to the
// relays it may forward the chain's flows to and, at the exit, the
// targets. Measurements younger than fresh are reused.
func (r *Relay) LinkTable(ctx context.Context, c *v1alpha1.Chain, fresh time.Duration) *probe.Table {
	t := &probe.Table{Relay: r.cfg.Name}
	var wg sync.WaitGroup
	if peers := manifest.NextHopsOf(c, r.cfg.Name); len(peers) > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); t.Links = r.links.Measure(ctx, peers, fresh) }()
	}
	if c.Spec.Exit == r.cfg.Name {
		wg.Add(1)
		go func() { defer wg.Done(); t.Targets = r.targets.Measure(ctx, r.targetSpecs(r.set.Load(), c), fresh) }()
	}
	wg.Wait()
	return t
}

// routedChain finds the routed chain a probe or link request names.
func (r *Relay) routedChain(key string) (*v1alpha1.Chain, string, error) {
	c := r.set.Load().Chain(key)
	switch {
	case c == nil:
		return nil, "unknown_chain", fmt.Errorf("no Chain %q", key)
	case !c.Spec.Mode.Routed():
		return nil, "unknown_chain", fmt.Errorf("Chain %q is %s, not routed", key, c.Spec.Mode)
	}
	return c, "", nil
}

// A link request's header names the chain and the path to the relay that
// answers (the receiver first); a small body follows: the chain's current
// route as the entry uses it, which relays learn and export. The answer is
// the relay's table, length-prefixed JSON.
type linksBody struct {
	Route []string `json:"route,omitempty"`
}

// maxLinksBody bounds a link request's body.
const maxLinksBody = 4 << 10

// serveLinks answers a link request of a routed chain, or passes it on
// toward the relay it is for.
func (r *Relay) serveLinks(peer string, s *quicgo.Stream, h *hop.Header) {
	c, reason, err := r.routedChain(h.Tunnel)
	if err == nil && !manifest.AllowsPath(c, peer, r.cfg.Name, h.Route) {
		reason, err = "bad_route", fmt.Errorf("link request along %v from %q is not on a route of Chain %q", h.Route, peer, h.Tunnel)
	}
	if err != nil {
		r.reject(s, peer, reason, err, *h)
		return
	}
	if len(h.Route) > 1 {
		out, err := r.onward(h, v1alpha1.TransportQUIC)
		if err != nil {
			resetStream(s, hop.CodeNextHop)
			return
		}
		pipe(newStreamEnd(s), out, probeCounter, probeCounter)
		return
	}
	s.SetReadDeadline(time.Now().Add(headerTimeout))
	var body linksBody
	if err := readFramed(s, maxLinksBody, &body); err != nil {
		r.reject(s, peer, "bad_header", fmt.Errorf("link request body: %w", err), *h)
		return
	}
	if len(body.Route) > 0 && manifest.ValidRoute(c, body.Route) == nil {
		r.routes.mu.Lock()
		old := r.routes.learned[h.Tunnel]
		r.routes.learned[h.Tunnel] = body.Route
		r.routes.mu.Unlock()
		if !slices.Equal(old, body.Route) {
			r.exportRoutes(r.set.Load())
		}
	}
	interval := routectl.Interval(c)
	ctx, cancel := context.WithTimeout(r.ctx, routectl.ProbeWait(interval))
	table := r.LinkTable(ctx, c, interval/4)
	cancel()
	s.SetWriteDeadline(time.Now().Add(headerTimeout))
	if err := writeFramed(s, probe.MaxTableSize, table); err != nil {
		resetStream(s, hop.CodeReset)
		return
	}
	s.Close()
}

// writeFramed writes v as JSON after its 4-byte length.
func writeFramed(w io.Writer, limit int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > limit {
		return fmt.Errorf("%d bytes, more than %d", len(b), limit)
	}
	_, err = w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	return err
}

// readFramed reads what writeFramed wrote, refusing more than limit bytes.
func readFramed(rd io.Reader, limit int, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(rd, n[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > uint32(limit) {
		return fmt.Errorf("%d bytes, more than %d", size, limit)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(rd, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// probeCounter counts nothing: probes are not tunnel traffic.
var probeCounter = prometheus.NewCounter(prometheus.CounterOpts{Name: "hoplink_probe_bytes_unexported"})

// serveProbe carries an in-band probe one hop further, or answers it at the
// exit. A probe is checked like a flow: its chain must allow the route from
// the peer that sent it.
func (r *Relay) serveProbe(peer string, in end, h *hop.Header) {
	c, reason, err := r.routedChain(h.Tunnel)
	if err == nil && !manifest.AllowsHop(c, peer, r.cfg.Name, h.Route) {
		reason, err = "bad_route", fmt.Errorf("route %v from %q is not a route of Chain %q", h.Route, peer, h.Tunnel)
	}
	if err != nil {
		r.reject(nil, peer, reason, err, *h)
		in.fail(hop.CodeRejected)
		return
	}
	if !r.acquire() {
		r.flowError(h.Tunnel, "flow_limit")
		in.fail(hop.CodeRejected)
		return
	}
	defer r.release()
	if len(h.Route) == 1 {
		// The exit: the asker sends nothing after the header, so EOF comes
		// with it; then the answer.
		io.Copy(io.Discard, io.LimitReader(in, 1))
		if _, err := in.Write([]byte{probeAnswer}); err != nil {
			in.abort()
			return
		}
		in.closeWrite()
		in.close()
		return
	}
	out, err := r.onward(h, c.Spec.Transport)
	if err != nil {
		in.fail(hop.CodeNextHop)
		return
	}
	pipe(in, out, probeCounter, probeCounter)
}

// probeAnswer is the exit's one-byte answer to an in-band probe.
const probeAnswer = 1

// pipeProbes is how many in-band probes measure one route in a round; the
// median is kept.
const pipeProbes = 3

// PipeProbe measures routes of a chain this relay enters end to end: for
// each, a few in-band probes through the real relays, to the exit and back.
func (r *Relay) PipeProbe(ctx context.Context, c *v1alpha1.Chain, routes [][]string) []probe.PipeResult {
	out := make([]probe.PipeResult, len(routes))
	var wg sync.WaitGroup
	for i, rt := range routes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = r.pipeProbe(ctx, c, rt)
		}()
	}
	wg.Wait()
	return out
}

func (r *Relay) pipeProbe(ctx context.Context, c *v1alpha1.Chain, rt []string) probe.PipeResult {
	res := probe.PipeResult{Route: rt}
	if err := manifest.ValidRoute(c, rt); err != nil || rt[0] != r.cfg.Name || len(rt) < 2 {
		res.Err = fmt.Sprintf("route %v cannot be probed from relay %q", rt, r.cfg.Name)
		return res
	}
	rtts := make([]time.Duration, pipeProbes)
	errs := make([]error, pipeProbes)
	var wg sync.WaitGroup
	for i := range pipeProbes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the probes so that each rides its own packets.
			select {
			case <-time.After(time.Duration(i) * probe.DefaultGap):
			case <-ctx.Done():
			}
			rtts[i], errs[i] = r.probeOnce(ctx, c, rt)
		}()
	}
	wg.Wait()
	var ok []time.Duration
	for i, d := range rtts {
		if errs[i] == nil {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		res.Err = errors.Join(errs...).Error()
		return res
	}
	slices.Sort(ok)
	res.RTT = probe.Duration(ok[len(ok)/2])
	return res
}

func (r *Relay) probeOnce(ctx context.Context, c *v1alpha1.Chain, rt []string) (time.Duration, error) {
	start := time.Now()
	out, err := r.nextHopEnd(ctx, &hop.Header{Kind: hop.KindProbe, Tunnel: manifest.Key(c.Namespace, c.Name), Route: rt[1:]}, c.Spec.Transport)
	if err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, out.abort)
	defer stop()
	if err := out.closeWrite(); err != nil {
		out.abort()
		return 0, err
	}
	var b [1]byte
	if _, err := io.ReadFull(out, b[:]); err != nil {
		out.abort()
		return 0, fmt.Errorf("probe of %v: %w", rt, err)
	}
	d := time.Since(start)
	if b[0] != probeAnswer {
		out.abort()
		return 0, fmt.Errorf("probe of %v: unexpected answer %d", rt, b[0])
	}
	io.Copy(io.Discard, io.LimitReader(out, 1)) // the exit's EOF
	out.close()
	return d, nil
}

// relayMeasurer is how an entry relay's route controller measures: its own
// links directly, its peers' with link requests over QUIC (through other
// relays to those it has no link to), routes by in-band probes.
type relayMeasurer Relay

func (m *relayMeasurer) Links(ctx context.Context, req routectl.LinksRequest) (*probe.Table, error) {
	r := (*Relay)(m)
	if req.Relay == r.cfg.Name {
		return r.LinkTable(ctx, req.Chain, req.Fresh), nil
	}
	path := append(slices.Clone(req.Through), req.Relay)
	// A relay without a live connection is not waited for: the round asks
	// it through another relay instead, while the link keeps redialing.
	conn := r.ep.Live(path[0])
	if conn == nil {
		return nil, fmt.Errorf("%w: %s", rquic.ErrPeerDown, path[0])
	}
	s, err := conn.OpenFlow(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { resetStream(s, hop.CodeReset) })
	defer stop()
	h := hop.Header{Kind: hop.KindLinks, Tunnel: manifest.Key(req.Chain.Namespace, req.Chain.Name), Route: path}
	b, err := h.Append(nil)
	if err == nil {
		_, err = s.Write(b)
	}
	if err == nil {
		err = writeFramed(s, maxLinksBody, linksBody{Route: req.Current})
	}
	if err == nil {
		err = s.Close()
	}
	if err != nil {
		resetStream(s, hop.CodeReset)
		return nil, err
	}
	var t probe.Table
	if err := readFramed(s, probe.MaxTableSize, &t); err != nil {
		resetStream(s, hop.CodeReset)
		return nil, fmt.Errorf("link table of %s: %w", req.Relay, err)
	}
	if t.Relay != req.Relay {
		return nil, fmt.Errorf("link table of %s names relay %q", req.Relay, t.Relay)
	}
	return &t, nil
}
func (m *relayMeasurer) Pipe(ctx context.Context, c *v1alpha1.Chain, routes [][]string) ([]probe.PipeResult, error) {
	return (*Relay)(m).PipeProbe(ctx, c, routes), nil
}
