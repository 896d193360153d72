package observe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
)

// Prober measures through relays' admin APIs: adminapi.Client.
type Prober interface {
	Asker
	Links(ctx context.Context, relay, endpoint, chain string, fresh time.Duration) (*measure.Table, error)
	Trace(ctx context.Context, relay, endpoint, chain string, routes [][]string) ([]measure.Trace, error)
}

// Probe is a chain measured now, hop by hop like traceroute: each link of
// its route as the relay at its start probes it, the exit's connect time to
// each target, and the route and every candidate end to end through the
// real relays.
type Probe struct {
	Chain string   `json:"chain"`
	Mode  string   `json:"mode"`
	Route []string `json:"route"`
	Hops  []Hop    `json:"hops"`
	// Targets are the exit's connect times to the chain's Tunnels' targets.
	Targets []measure.Target `json:"targets,omitempty"`
	// TargetErr says why the exit's connect times are missing.
	TargetErr string `json:"targetError,omitempty"`
	// Traces are the route (first) and the candidates, end to end.
	Traces []measure.Trace `json:"traces"`
}

// Hop is one link of the route, measured by the relay it starts at.
type Hop struct {
	From string           `json:"from"`
	To   string           `json:"to"`
	RTT  measure.Duration `json:"rtt,omitempty"`
	// Jitter and Loss are the probes' of the recent rounds.
	Jitter measure.Duration `json:"jitter,omitempty"`
	Loss   float64          `json:"loss"`
	Err    string           `json:"error,omitempty"`
	// Family is the IP family the link runs on (ipv4, ipv6).
	Family string `json:"family,omitempty"`
}

// ProbeChain measures chain (namespace/name, or a name in namespace ns)
// of set now.
func ProbeChain(ctx context.Context, set *manifest.Set, p Prober, chain, ns string) (*Probe, error) {
	c := set.Chain(chain)
	if c == nil {
		c = set.Chain(manifest.Key(ns, chain))
	}
	if c == nil {
		// Suggest names as they would be typed here: NAME in ns.
		var typed []string
		for _, k := range chainNames(set) {
			typed = append(typed, strings.TrimPrefix(k, ns+"/"))
		}
		return nil, fmt.Errorf("no Chain %q in the manifests (chains: %s)%s", chain, strings.Join(typed, ", "), manifest.DidYouMean(chain, typed))
	}
	key := manifest.Key(c.Namespace, c.Name)
	var mu sync.Mutex
	answered := map[string]string{}
	endpoint := func(relay string) (string, error) {
		rn := set.Relay(relay)
		if rn == nil || len(rn.Spec.Endpoints) == 0 {
			return "", fmt.Errorf("relay %s has no spec.endpoints to ask it at", relay)
		}
		if len(rn.Spec.Endpoints) == 1 {
			return rn.Spec.Endpoints[0], nil
		}
		// Several (pods, or both IP families of one): the first that
		// answers, as status finds it, since this host may reach only one
		// family.
		mu.Lock()
		ep, ok := answered[relay]
		mu.Unlock()
		if ok {
			return ep, nil
		}
		r := ask(ctx, p, rn)
		if r.Status == nil {
			return "", fmt.Errorf("relay %s did not answer: %s", relay, r.Err)
		}
		mu.Lock()
		answered[relay] = r.Endpoint
		mu.Unlock()
		return r.Endpoint, nil
	}
	entryEP, err := endpoint(c.Spec.Entry)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx, c.Spec.Entry, entryEP)
	if err != nil {
		return nil, fmt.Errorf("the entry %s: %w", c.Spec.Entry, err)
	}
	out := &Probe{Chain: key, Mode: string(c.Spec.Mode)}
	if out.Mode == "" {
		out.Mode = "static"
	}
	var candidates [][]string
	for _, cr := range st.Chains {
		if cr.Chain == key {
			out.Route = cr.Route
			for _, cand := range cr.Candidates {
				if !slices.Equal(cand.Route, cr.Route) {
					candidates = append(candidates, cand.Route)
				}
			}
		}
	}
	if len(out.Route) == 0 {
		return nil, fmt.Errorf("chain %s has no route yet at its entry %s", key, c.Spec.Entry)
	}

	// Every relay of the route measures its links now, at once.
	out.Hops = make([]Hop, len(out.Route)-1)
	var wg sync.WaitGroup
	for i := range out.Hops {
		out.Hops[i] = Hop{From: out.Route[i], To: out.Route[i+1]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &out.Hops[i]
			ep, err := endpoint(h.From)
			if err != nil {
				h.Err = err.Error()
				return
			}
			t, err := p.Links(ctx, h.From, ep, key, 0)
			if err != nil {
				h.Err = fmt.Sprintf("relay %s did not answer: %v", h.From, err)
				return
			}
			for _, l := range t.Links {
				if l.To == h.To {
					h.RTT, h.Jitter, h.Loss, h.Family = l.RTT, l.Jitter, l.Loss, l.Family
					if !l.Up {
						h.Err = "no answer to this round's probes"
					}
					return
				}
			}
			h.Err = "the relay did not measure this link"
		}()
	}
	exit := out.Route[len(out.Route)-1]
	var targetErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		ep, err := endpoint(exit)
		if err != nil {
			targetErr = err
			return
		}
		t, err := p.Links(ctx, exit, ep, key, 0)
		if err != nil {
			targetErr = fmt.Errorf("the exit %s did not answer: %w", exit, err)
			return
		}
		out.Targets = t.Targets
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		routes := append([][]string{out.Route}, candidates...)
		if len(routes) > adminapi.MaxTraceRoutes {
			routes = routes[:adminapi.MaxTraceRoutes]
		}
		tr, err := p.Trace(ctx, c.Spec.Entry, entryEP, key, routes)
		if err != nil {
			for _, rt := range routes {
				out.Traces = append(out.Traces, measure.Trace{Route: rt, Err: err.Error()})
			}
			return
		}
		out.Traces = tr
	}()
	wg.Wait()
	if targetErr != nil {
		out.TargetErr = targetErr.Error()
	}
	return out, nil
}

func chainNames(set *manifest.Set) []string {
	var out []string
	for _, c := range set.Chains {
		out = append(out, manifest.Key(c.Namespace, c.Name))
	}
	return out
}

// Failures lists the parts of the probe that failed, each with why: a
// link, a target, the exit that could not be asked, a route end to end.
func (p *Probe) Failures() []string {
	var out []string
	for _, h := range p.Hops {
		if h.Err != "" {
			out = append(out, fmt.Sprintf("link %s -> %s: %s", h.From, h.To, h.Err))
		}
	}
	for _, t := range p.Targets {
		if !t.Up {
			out = append(out, fmt.Sprintf("target %s of tunnel %s: %s", t.Target, t.Tunnel, orDash(t.Error)))
		}
	}
	if p.TargetErr != "" {
		out = append(out, "targets: "+p.TargetErr)
	}
	for _, t := range p.Traces {
		if t.Err != "" {
			out = append(out, fmt.Sprintf("%s end to end: %s", routeString(t.Route), t.Err))
		}
	}
	return out
}
