package relay

import (
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/eyeballs"
	"github.com/hoplink/hoplink/relay/probe"
)

// status is what the relay tells the operator and `hoplink status` of
// itself: readiness, its links to its next hops, the routes of the chains
// it enters, its Tunnel entries and its latest problems.
func (r *Relay) status() *adminapi.Status {
	set := r.set.Load()
	s := &adminapi.Status{Relay: r.cfg.Name, Version: r.cfg.Version, Ready: r.ready.Load(),
		Draining: r.env.draining.Load(), Problems: r.env.problems.list(), Congestion: r.congestionStatus()}
	if id := r.cfg.Identity; id != nil {
		s.CertificateExpires = id.NotAfter().UTC()
	}
	if r.peers != nil {
		for _, peer := range set.NextHops(r.cfg.Name) {
			s.Peers = append(s.Peers, r.peerStatus(peer))
		}
	}
	chains := set.Chains
	if r.routes == nil {
		chains = nil // not started: no route known yet
	}
	for _, c := range chains {
		if c.Spec.Entry != r.cfg.Name {
			continue
		}
		key := manifest.Key(c.Namespace, c.Name)
		cr := adminapi.ChainRoute{Chain: key, Mode: string(c.Spec.Mode), Route: r.routes.known(c)}
		if cr.Mode == "" {
			cr.Mode = "static"
		}
		if d, changed, ok := r.routes.lastRound(key); ok {
			cr.Reason, cr.Kept, cr.Changed = d.Reason, d.Kept, changed.UTC()
			for _, p := range d.Candidates {
				cr.Candidates = append(cr.Candidates, adminapi.Candidate{Route: p.Relays, Cost: measure.Duration(p.Cost),
					Estimated: measure.Duration(p.Estimated), Measured: measure.Duration(p.Measured)})
			}
		}
		s.Chains = append(s.Chains, cr)
	}
	slices.SortFunc(s.Chains, func(a, b adminapi.ChainRoute) int { return strings.Compare(a.Chain, b.Chain) })
	var probed *probe.Targets
	if r.measure != nil {
		probed = r.measure.targets
	}
	s.TargetsDown = targetsDown(r.env, probed, set)
	s.Limited = r.env.limited.look(r.env, set, time.Now())
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range set.EntryTunnels(r.cfg.Name) {
		key := manifest.Key(t.Namespace, t.Name)
		et := r.tunnels[key]
		e := adminapi.Entry{Tunnel: key, Open: et != nil, Flows: r.env.entryFlows(key), Limits: limitsText(t.Spec.Limits)}
		if et != nil {
			e.Listen = et.listen
		} else if addrs, _ := r.env.entryListen(t); len(addrs) > 0 {
			e.Listen = listenText(addrs) // where it tries to
		}
		if err := r.failed[key]; err != nil {
			e.Error = err.Error()
		}
		s.Entries = append(s.Entries, e)
	}
	return s
}

// peerStatus is the link to peer as this relay sees it.
func (r *Relay) peerStatus(peer string) adminapi.Peer {
	p := adminapi.Peer{Name: peer, Up: r.peers.Up(peer), Draining: r.peers.Draining(peer)}
	if c := r.peers.Live(peer); c != nil {
		st := c.ConnectionStats()
		p.RTT, p.Jitter = measure.Duration(st.SmoothedRTT), measure.Duration(st.MeanDeviation)
		p.Family = eyeballs.FamilyOf(c.RemoteAddr())
		if st.PacketsSent > 0 {
			p.Loss = float64(st.PacketsLost) / float64(st.PacketsSent)
		}
	}
	tr, why := r.peers.LinkTransport(peer)
	p.Transport, p.TransportReason = string(tr), why
	return p
}

// entryFlows is how many flows of tunnel enter at this relay now.
func (e *env) entryFlows(tunnel string) int64 {
	var m dto.Metric
	if err := e.m.ActiveFlows.WithLabelValues(e.name, tunnel, "entry").Write(&m); err != nil {
		return 0
	}
	return int64(m.GetGauge().GetValue())
}
