package relay

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/eyeballs"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/probe"
	"github.com/hoplink/hoplink/routectl"
)

// measurer is a relay's part in routing. It probes the links the relay may
// forward on (in the background, and whenever a route controller asks)
// and, as the exit of a routed chain, its Tunnels' targets; it answers
// link requests and traces from peers; and it is the Measurer of the route
// controller an entry relay runs for its chains: its own table directly,
// its peers' by link requests over QUIC (through other relays to those it
// has no link to), routes by traces.
type measurer struct {
	*env
	peers   *nexthop.Peers
	hops    *nexthop.Hops
	links   *probe.Links
	targets *probe.Targets
	routes  *routeBook
	// requests shares the link requests served at once, answered or passed
	// on, between the peers that send them (newLinkRequests).
	requests *quota
}

// probePeers is the link layer as the prober sees it. A draining peer is
// down for routing: it takes no new flows. What a round heard tells the
// link layer which peers stopped answering. The link layer is the
// measurer's, read when a round runs.
type probePeers struct{ p *nexthop.Peers }

func (p probePeers) Sender(peer string) probe.Sender {
	if c := p.p.Live(peer); c != nil && !p.p.Draining(peer) {
		return c
	}
	return nil
}

func (p probePeers) Answered(peer string, ok bool) { p.p.Answering(peer, ok) }

// probeInterval is how often this relay probes in the background: the
// shortest probe interval of the routed chains it is part of.
func (m *measurer) probeInterval(set *manifest.Set) time.Duration {
	every := v1alpha1.DefaultProbeInterval
	for _, c := range set.Chains {
		if c.Spec.Mode.Routed() && slices.Contains(manifest.Members(c), m.name) {
			every = min(every, routectl.Interval(c))
		}
	}
	return every
}

// probeLoop keeps the measurements of every link the relay may forward on,
// and of the targets of the routed chains it ends, at most an interval old,
// so metrics stay current when no route controller asks.
func (m *measurer) probeLoop() {
	for {
		set := m.manifests()
		every := m.probeInterval(set)
		peers := set.NextHops(m.name)
		var targets []probe.TargetSpec
		for _, c := range set.Chains {
			if c.Spec.Mode.Routed() && c.Spec.Exit == m.name {
				targets = append(targets, targetSpecs(set, c)...)
			}
		}
		m.links.Retain(peers)
		m.targets.Retain(targets)
		ctx, cancel := context.WithTimeout(m.ctx, routectl.ProbeWait(every))
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); m.links.Measure(ctx, peers, every/2) }()
		go func() { defer wg.Done(); m.targets.Measure(ctx, targets, every/2) }()
		wg.Wait()
		cancel()
		select {
		case <-time.After(every):
		case <-m.ctx.Done():
			return
		}
	}
}

// targetSpecs lists the TCP targets of a chain's Tunnels; UDP targets have
// no connect to time.
func targetSpecs(set *manifest.Set, c *v1alpha1.Chain) []probe.TargetSpec {
	var out []probe.TargetSpec
	for _, t := range set.Tunnels {
		if t.Namespace == c.Namespace && t.Spec.Chain == c.Name && t.Spec.Protocol == v1alpha1.ProtocolTCP {
			out = append(out, probe.TargetSpec{Tunnel: manifest.Key(t.Namespace, t.Name), Target: t.Spec.Target})
		}
	}
	return out
}

// table measures this relay's part of a routed chain: its links to the
// relays it may forward the chain's flows to and, at the exit, the
// targets. Measurements younger than fresh are reused.
func (m *measurer) table(ctx context.Context, c *v1alpha1.Chain, fresh time.Duration) *measure.Table {
	t := &measure.Table{Relay: m.name}
	var wg sync.WaitGroup
	if peers := manifest.NextHopsOf(c, m.name); len(peers) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Links = m.links.Measure(ctx, peers, fresh)
			for i := range t.Links {
				tr, why := m.peers.LinkTransport(t.Links[i].To)
				t.Links[i].Transport, t.Links[i].TransportReason = string(tr), why
				t.Links[i].Draining = m.peers.Draining(t.Links[i].To)
				if c := m.peers.Live(t.Links[i].To); c != nil {
					t.Links[i].Family = eyeballs.FamilyOf(c.RemoteAddr())
				}
			}
		}()
	}
	if c.Spec.Exit == m.name {
		wg.Add(1)
		go func() { defer wg.Done(); t.Targets = m.targets.Measure(ctx, targetSpecs(m.manifests(), c), fresh) }()
	}
	wg.Wait()
	return t
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

// linksTimeout bounds a link request at every hop, answered or passed on:
// the relay that answers takes at most routectl.ProbeWait (5 s) for its
// table, and the asker gives up sooner (tablesWait). Without it a request
// whose asker never finished held its streams and goroutines for good.
var linksTimeout = 10 * time.Second

// Link requests a relay serves at once: at most maxLinkRequestsPerPeer
// from one peer, maxLinkRequests in all, so that no peer can take them all
// nor hold goroutines without bound. An entry asks each relay of its
// routed chains once a round, and each request lives a fraction of a
// round, so honest peers stay far below.
var maxLinkRequests, maxLinkRequestsPerPeer = 512, 64

func newLinkRequests() *quota {
	return newQuota(maxLinkRequests, maxLinkRequestsPerPeer, maxLinkRequestsPerPeer)
}

// serveLinks answers an admitted link request, or passes it on toward the
// relay it is for, within linksTimeout and peer's share of requests.
func (m *measurer) serveLinks(from *nexthop.Hop, h *hop.Header, c *v1alpha1.Chain) {
	peer, s := from.Peer, from.Stream()
	// The share is per peer (a quota keyed by peer in place of a Tunnel).
	if why := m.requests.take(peer, netip.Addr{}, 0); why != "" {
		limit := "the peer's share"
		if why == flowLimit {
			limit = "the relay's bound"
		}
		m.rejected(peer, from.Remote, "links_limit", fmt.Errorf("link requests in progress reached %s", limit), h.Tunnel)
		from.Refuse(hop.CodeRejected)
		return
	}
	defer m.requests.give(peer, netip.Addr{})
	deadline := time.Now().Add(linksTimeout)
	if len(h.Route) > 1 {
		ctx, cancel := context.WithDeadline(m.ctx, deadline)
		next, err := m.hops.Open(ctx, nexthop.Onward(h), nexthop.OpenOptions{Transport: v1alpha1.TransportQUIC})
		cancel()
		if err != nil {
			from.Refuse(hop.CodeNextHop)
			return
		}
		out := next.Stream()
		in := s
		// Past the deadline both sides are reset, which ends the join.
		expire := time.AfterFunc(time.Until(deadline), func() { in.Abort(); out.Abort() })
		defer expire.Stop()
		flow.Join(in, out, noCount{}, noCount{}, 0)
		return
	}
	from.SetDeadline(deadline)
	var body linksBody
	if err := readFramed(s, maxLinksBody, &body); err != nil {
		m.rejected(peer, from.Remote, "bad_header", fmt.Errorf("link request body: %w", err), h.Tunnel)
		from.Refuse(hop.CodeRejected)
		return
	}
	if len(body.Route) > 0 && manifest.ValidRoute(c, body.Route) == nil {
		m.routes.learn(h.Tunnel, body.Route)
	}
	interval := routectl.Interval(c)
	ctx, cancel := context.WithTimeout(m.ctx, routectl.ProbeWait(interval))
	table := m.table(ctx, c, interval/4)
	cancel()
	if err := writeFramed(s, measure.MaxTableSize, table); err != nil {
		from.Refuse(hop.CodeReset)
		return
	}
	s.CloseWrite()
	s.Close()
}

// Links is the route controller asking one relay of a chain for its table:
// this relay's directly, a peer's with a link request.
func (m *measurer) Links(ctx context.Context, req routectl.LinksRequest) (*measure.Table, error) {
	if req.Relay == m.name {
		// Its probes wait as long as a peer's would (serveLinks), however
		// long the asker is ready to wait for the table.
		ctx, cancel := context.WithTimeout(ctx, routectl.ProbeWait(routectl.Interval(req.Chain)))
		defer cancel()
		return m.table(ctx, req.Chain, req.Fresh), nil
	}
	path := append(slices.Clone(req.Through), req.Relay)
	// A relay without a live connection is not waited for: the round asks
	// it through another relay instead, while the link keeps redialing.
	next, err := m.hops.Open(ctx, &hop.Header{Kind: hop.KindLinks, Tunnel: manifest.Key(req.Chain.Namespace, req.Chain.Name), Route: path}, nexthop.OpenOptions{Live: true})
	if err != nil {
		return nil, err
	}
	s := next.Stream()
	stop := context.AfterFunc(ctx, s.Abort)
	defer stop()
	err = writeFramed(s, maxLinksBody, linksBody{Route: req.Current})
	if err == nil {
		err = s.CloseWrite()
	}
	if err != nil {
		s.Abort()
		return nil, err
	}
	var t measure.Table
	if err := readFramed(s, measure.MaxTableSize, &t); err != nil {
		s.Abort()
		return nil, fmt.Errorf("link table of %s: %w", req.Relay, err)
	}
	if t.Relay != req.Relay {
		return nil, fmt.Errorf("link table of %s names relay %q", req.Relay, t.Relay)
	}
	return &t, nil
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

// noCount counts nothing: traces and link requests are not tunnel traffic.
type noCount struct{}

func (noCount) Add(float64) {}
