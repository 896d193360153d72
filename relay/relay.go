// Package relay is hoplink's data plane: a Relay accepts flows on the
// Tunnels that enter the network through it, carries flows of its peers one
// hop further, and dials targets for the chains it ends. What it may do is
// decided by the manifests it was given and nothing else: a peer's header is
// a request, checked against them at every hop.
package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/probe"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/routectl"
	"github.com/hoplink/hoplink/relay/tlslink"
)

// Defaults of Config.
const (
	DefaultMaxFlows     = 1 << 16
	DefaultSetupTimeout = 10 * time.Second
)

// Config is what a relay needs to run.
type Config struct {
	// Name is this relay's RelayNode name.
	Name      string
	Manifests *manifest.Set
	Identity  *pki.Identity
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	// MaxFlows bounds the TCP flows and UDP sessions this relay carries at
	// once, in every role; past it new flows are refused and counted.
	MaxFlows int
	// SetupTimeout bounds reaching the next hop or connecting to a target.
	SetupTimeout time.Duration
	// Route makes the relay choose the routes of the routed (sum and pipe)
	// chains it enters, as standalone relays and local mode do. Without it
	// the relay follows the routes in the Chains' status, which the
	// operator's route controller writes.
	Route bool
	// NoTUNOffload opens tun Tunnels' devices without segmentation offload
	// (for comparison; offload is on by default where the kernel has it).
	NoTUNOffload bool
}

// Relay is one running relay.
type Relay struct {
	cfg   Config
	set   atomic.Pointer[manifest.Set]
	ep    *rquic.Endpoint
	tl    *tlslink.Endpoint
	flows chan struct{} // a token per flow in progress
	ready atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	tunnels map[string]*entryTunnel // open listeners by Tunnel key

	exits map[string]*packetExit // exit devices of packet-mode Tunnels, by key

	links   *probe.Links
	targets *probe.Targets
	routes  *routes
	ctl     *routectl.Controller // when Config.Route
}

// entryTunnel is a Tunnel's open listener on this relay, with the spec it
// was opened with: a Tunnel whose spec changes is reopened.
type entryTunnel struct {
	spec v1alpha1.TunnelSpec
	stop func()
}

// New checks the config; Start binds the sockets.
func New(cfg Config) (*Relay, error) {
	if cfg.Manifests.Relay(cfg.Name) == nil {
		return nil, fmt.Errorf("relay %q is not defined in the manifests", cfg.Name)
	}
	if cfg.Identity == nil || cfg.Identity.Name != cfg.Name {
		return nil, fmt.Errorf("relay %q has no certificate for its name", cfg.Name)
	}
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = DefaultMaxFlows
	}
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = DefaultSetupTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Log = cfg.Log.With("relay", cfg.Name)
	r := &Relay{cfg: cfg, flows: make(chan struct{}, cfg.MaxFlows), tunnels: map[string]*entryTunnel{}, routes: newRoutes(),
		exits: map[string]*packetExit{}}
	r.links = probe.NewLinks(probe.LinkOptions{Relay: cfg.Name, Metrics: cfg.Metrics, Conn: func(peer string) probe.Sender {
		if c := r.ep.Live(peer); c != nil {
			return c
		}
		return nil
	}})
	r.targets = probe.NewTargets(cfg.Name, cfg.Metrics)
	r.set.Store(cfg.Manifests)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// Name is the relay's RelayNode name.
func (r *Relay) Name() string { return r.cfg.Name }

// Ready reports whether every listener is open.
func (r *Relay) Ready() bool { return r.ready.Load() }

// Addr is the relay's bound QUIC address.
func (r *Relay) Addr() net.Addr { return r.ep.Addr() }

// Start opens the relay's QUIC listener and its Tunnels' listeners, and
// starts connecting to the peers its routes lead to.
func (r *Relay) Start() error {
	set := r.set.Load()
	self := set.Relay(r.cfg.Name)
	listen := net.JoinHostPort(self.Spec.Listen.Address, strconv.Itoa(int(self.Spec.Listen.Port)))
	ep, err := rquic.Listen(rquic.Options{
		Name:        r.cfg.Name,
		Identity:    r.cfg.Identity,
		Listen:      listen,
		KnownPeer:   func(name string) bool { return r.set.Load().Relay(name) != nil },
		Handler:     r.handleStream,
		OnProbeEcho: r.links.Echo,
		Metrics:     r.cfg.Metrics,
		Log:         r.cfg.Log,
	})
	if err != nil {
		return fmt.Errorf("RelayNode %q: spec.listen: %w", r.cfg.Name, err)
	}
	r.ep = ep
	// TLS listens on the same port number, on TCP, for chains that carry
	// their TCP flows over TLS.
	r.tl, err = tlslink.Listen(tlslink.Options{
		Name:      r.cfg.Name,
		Identity:  r.cfg.Identity,
		Listen:    listen,
		KnownPeer: func(name string) bool { return r.set.Load().Relay(name) != nil },
		Handler:   r.handleTLS,
		Admin:     r.adminAPI(),
		Metrics:   r.cfg.Metrics,
		Log:       r.cfg.Log,
	})
	if err != nil {
		ep.Close()
		return fmt.Errorf("RelayNode %q: spec.listen: %w", r.cfg.Name, err)
	}
	r.connectPeers(set)
	r.syncPacketExits(set)
	for _, t := range set.EntryTunnels(r.cfg.Name) {
		if err := r.openTunnel(t); err != nil {
			r.Close()
			return err
		}
	}
	r.startRouting()
	r.ready.Store(true)
	r.cfg.Metrics.Ready.WithLabelValues(r.cfg.Name).Set(1)
	r.cfg.Log.Info("relay started", "listen", ep.Addr().String(), "peers", set.NextHops(r.cfg.Name))
	return nil
}

func (r *Relay) link(set *manifest.Set, peer string) *rquic.Link {
	return r.ep.Link(peer, set.Relay(peer).Spec.Endpoints)
}

// connectPeers starts the links (and warms the TLS pools) of every peer the
// manifests route this relay's flows to, and gives existing links the
// peers' current endpoints.
func (r *Relay) connectPeers(set *manifest.Set) {
	for _, peer := range set.NextHops(r.cfg.Name) {
		r.link(set, peer).SetAddrs(set.Relay(peer).Spec.Endpoints)
	}
	for _, c := range set.Chains {
		if c.Spec.Transport != v1alpha1.TransportTLS {
			continue
		}
		var next []string
		route := manifest.Route(c)
		if i := slices.Index(route, r.cfg.Name); i >= 0 && i+1 < len(route) {
			next = append(next, route[i+1])
		}
		if c.Spec.Mode.Routed() {
			next = append(next, manifest.NextHopsOf(c, r.cfg.Name)...)
		}
		for _, peer := range next {
			r.tl.Pool(peer, set.Relay(peer).Spec.Endpoints) // warm it now
		}
	}
}

// Update applies new manifests to a running relay. New flows follow them at
// once; flows already open finish on the path they started on. Listeners of
// Tunnels that are gone or whose spec changed close (their open TCP flows
// go on), and new ones open. A Tunnel that cannot open is reported in the
// returned error and does not stop the others. The relay's own listen
// address is fixed at Start.
func (r *Relay) Update(set *manifest.Set) error {
	if set.Relay(r.cfg.Name) == nil {
		return fmt.Errorf("RelayNode %q is no longer in the manifests; keeping the previous ones", r.cfg.Name)
	}
	r.set.Store(set)
	r.connectPeers(set)
	r.routingUpdated(set)
	r.syncPacketExits(set)
	want := map[string]*v1alpha1.Tunnel{}
	for _, t := range set.EntryTunnels(r.cfg.Name) {
		want[manifest.Key(t.Namespace, t.Name)] = t
	}
	r.mu.Lock()
	var stops []func()
	for key, et := range r.tunnels {
		if t := want[key]; t == nil || !equality.Semantic.DeepEqual(et.spec, t.Spec) {
			stops = append(stops, et.stop)
			delete(r.tunnels, key)
			r.cfg.Log.Info("tunnel closed", "tunnel", key)
		}
	}
	r.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	var errs []error
	for key, t := range want {
		r.mu.Lock()
		_, open := r.tunnels[key]
		r.mu.Unlock()
		if !open {
			errs = append(errs, r.openTunnel(t))
		}
	}
	return errors.Join(errs...)
}

func (r *Relay) openTunnel(t *v1alpha1.Tunnel) error {
	var addr string
	if l := t.Spec.Listen; l != nil {
		addr = net.JoinHostPort(l.Address, strconv.Itoa(int(l.Port)))
	}
	key := manifest.Key(t.Namespace, t.Name)
	var stop func()
	switch t.Spec.Protocol {
	case v1alpha1.ProtocolTCP:
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("Tunnel %q: spec.listen: %w", key, err)
		}
		stop = func() { ln.Close() }
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serveTCP(ln.(*net.TCPListener), t)
		}()
	case v1alpha1.ProtocolUDP:
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("Tunnel %q: spec.listen: %w", key, err)
		}
		sizeUDP(pc.(*net.UDPConn))
		u := newUDPEntry(r, t, pc.(*net.UDPConn))
		stop = u.close
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			u.serve()
		}()
	case v1alpha1.ProtocolTUN:
		var err error
		if stop, err = r.openTUN(t, key); err != nil {
			return fmt.Errorf("Tunnel %q: %w", key, err)
		}
	default:
		return fmt.Errorf("Tunnel %q: spec.protocol %q is not supported", key, t.Spec.Protocol)
	}
	r.mu.Lock()
	r.tunnels[key] = &entryTunnel{spec: *t.Spec.DeepCopy(), stop: stop}
	r.mu.Unlock()
	chain := r.set.Load().ChainOf(t)
	var route any = manifest.Route(chain)
	if chain.Spec.Mode.Routed() {
		route = "by measurement"
	}
	if u := t.Spec.TUN; u != nil {
		r.cfg.Log.Info("tunnel open", "tunnel", key, "protocol", t.Spec.Protocol, "device", u.Name, "address", u.Address,
			"routes", u.Routes, "mode", u.Mode, "chain", chain.Name, "route", route)
		return nil
	}
	r.cfg.Log.Info("tunnel open", "tunnel", key, "protocol", t.Spec.Protocol, "listen", addr,
		"chain", chain.Name, "mode", chain.Spec.Mode, "route", route, "target", t.Spec.Target)
	return nil
}

// Close stops the listeners, ends every flow and connection, and waits for
// the relay's goroutines.
func (r *Relay) Close() error {
	r.ready.Store(false)
	r.cfg.Metrics.Ready.WithLabelValues(r.cfg.Name).Set(0)
	r.mu.Lock()
	tunnels := r.tunnels
	r.tunnels = map[string]*entryTunnel{}
	r.mu.Unlock()
	for _, et := range tunnels {
		et.stop()
	}
	if r.ctl != nil {
		r.ctl.Close()
	}
	r.closePacketExits()
	r.cancel()
	var err error
	if r.tl != nil {
		err = r.tl.Close()
	}
	if r.ep != nil {
		err = errors.Join(err, r.ep.Close())
	}
	r.wg.Wait()
	return err
}

// acquire takes a flow token, or reports that the relay is full.
func (r *Relay) acquire() bool {
	select {
	case r.flows <- struct{}{}:
		return true
	default:
		return false
	}
}

func (r *Relay) release() { <-r.flows }

// flowMetrics are one flow's series, resolved once.
type flowMetrics struct {
	up, down prometheus.Counter
}

func (r *Relay) begin(tunnel, role string) (fm flowMetrics, end func()) {
	m := r.cfg.Metrics
	m.Flows.WithLabelValues(r.cfg.Name, tunnel, role).Inc()
	active := m.ActiveFlows.WithLabelValues(r.cfg.Name, tunnel, role)
	active.Inc()
	return flowMetrics{
		up:   m.Bytes.WithLabelValues(r.cfg.Name, tunnel, "up"),
		down: m.Bytes.WithLabelValues(r.cfg.Name, tunnel, "down"),
	}, active.Dec
}

func (r *Relay) flowError(tunnel, reason string) {
	r.cfg.Metrics.FlowErrors.WithLabelValues(r.cfg.Name, tunnel, reason).Inc()
}

// headerTimeout bounds how long a peer may take to send a stream's header.
const headerTimeout = 10 * time.Second

// handleStream serves a stream a peer opened: read and check the header,
// then carry the flow on as a middle relay or end it as the exit.
func (r *Relay) handleStream(c *rquic.Conn, s *quicgo.Stream) {
	s.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := hop.Read(s)
	var peerReset *quicgo.StreamError
	if errors.As(err, &peerReset) {
		// The flow ended before its header arrived (a client that gave up
		// at once): nothing hostile, nothing to count.
		resetStream(s, hop.CodeReset)
		return
	}
	if err != nil {
		r.reject(s, c.Peer, "bad_header", err, hop.Header{})
		return
	}
	s.SetReadDeadline(time.Time{})
	switch h.Kind {
	case hop.KindLinks:
		r.serveLinks(c.Peer, s, &h)
		return
	case hop.KindProbe:
		r.serveProbe(c.Peer, newStreamEnd(s), &h)
		return
	}
	t, reason, err := r.authorize(c.Peer, &h)
	if err == nil && h.Kind == hop.KindPacket && len(h.Route) == 1 {
		x, xerr := r.packetExit(h.Tunnel)
		if xerr != nil {
			r.reject(s, c.Peer, "no_device", xerr, h)
			return
		}
		if !r.acquire() {
			r.flowError(h.Tunnel, "flow_limit")
			resetStream(s, hop.CodeRejected)
			return
		}
		defer r.release()
		r.servePacketQUIC(c, s, x)
		return
	}
	if err != nil {
		r.reject(s, c.Peer, reason, err, h)
		return
	}
	if !r.acquire() {
		r.flowError(h.Tunnel, "flow_limit")
		resetStream(s, hop.CodeRejected)
		return
	}
	defer r.release()
	switch {
	case len(h.Route) == 1 && h.Kind == hop.KindTCP:
		r.exitTCP(newStreamEnd(s), &h)
	case len(h.Route) == 1:
		r.exitUDP(c, s, &h, t)
	case h.Kind == hop.KindTCP:
		r.middleTCP(newStreamEnd(s), &h, t)
	default: // a UDP or packet session: datagrams and frames
		r.middle(c, s, &h)
	}
}

// handleTLS serves a flow that a peer sent over a TLS connection: the same
// header, the same checks, TCP flows only.
func (r *Relay) handleTLS(peer string, c *tls.Conn) {
	in := &tlsEnd{c: c, done: func() { r.tl.Done(c) }}
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		in.abort() // a spare the peer retired unused, or a peer gone
		return
	}
	h, err := hop.Read(io.MultiReader(bytes.NewReader(first[:]), c))
	if err != nil {
		r.reject(nil, peer, "bad_header", err, hop.Header{})
		in.abort()
		return
	}
	c.SetReadDeadline(time.Time{})
	if h.Kind == hop.KindProbe {
		r.serveProbe(peer, in, &h)
		return
	}
	t, reason, err := r.authorize(peer, &h)
	if err == nil && h.Kind == hop.KindUDP {
		reason, err = "wrong_protocol", fmt.Errorf("UDP sessions ride QUIC, not TLS")
	}
	if err != nil {
		r.reject(nil, peer, reason, err, h)
		in.abort()
		return
	}
	if !r.acquire() {
		r.flowError(h.Tunnel, "flow_limit")
		in.abort()
		return
	}
	defer r.release()
	if h.Kind == hop.KindPacket && len(h.Route) == 1 {
		x, xerr := r.packetExit(h.Tunnel)
		if xerr != nil {
			r.reject(nil, peer, "no_device", xerr, h)
			in.abort()
			return
		}
		r.servePacketTLS(in, x)
		return
	}
	if len(h.Route) == 1 {
		r.exitTCP(in, &h)
		return
	}
	r.middleTCP(in, &h, t)
}

// authorize checks a header against the manifests: the Tunnel exists, the
// stream kind is its protocol, the route is its chain's route as seen from
// this hop and the peer that sent it, and the target is the Tunnel's own.
func (r *Relay) authorize(peer string, h *hop.Header) (*v1alpha1.Tunnel, string, error) {
	set := r.set.Load()
	t := set.Tunnel(h.Tunnel)
	if t == nil {
		return nil, "unknown_tunnel", fmt.Errorf("no Tunnel %q", h.Tunnel)
	}
	u := t.Spec.TUN
	tunFlow := u != nil && u.Mode == v1alpha1.TunFlow && (h.Kind == hop.KindTCP || h.Kind == hop.KindUDP)
	tunPacket := u != nil && u.Mode == v1alpha1.TunPacket && h.Kind == hop.KindPacket
	if string(t.Spec.Protocol) != h.Kind.String() && !tunFlow && !tunPacket {
		return nil, "wrong_protocol", fmt.Errorf("Tunnel %q is %s, stream is %s", h.Tunnel, t.Spec.Protocol, h.Kind)
	}
	chain := set.ChainOf(t)
	if !manifest.AllowsHop(chain, peer, r.cfg.Name, h.Route) {
		return nil, "bad_route", fmt.Errorf("route %v from %q is not a route of Chain %q", h.Route, peer, chain.Name)
	}
	if tunPacket {
		return t, "", nil // its packets are checked one by one at the exit
	}
	if tunFlow {
		// A tun Tunnel reaches the addresses of its routes, and no other.
		if !manifest.TunReaches(t, h.Target) {
			return nil, "bad_target", fmt.Errorf("target %q is outside Tunnel %q's routes %v", h.Target, h.Tunnel, t.Spec.TUN.Routes)
		}
	} else if h.Target != t.Spec.Target {
		return nil, "bad_target", fmt.Errorf("target %q is not Tunnel %q's target", h.Target, h.Tunnel)
	}
	return t, "", nil
}

func (r *Relay) reject(s *quicgo.Stream, peer, reason string, err error, h hop.Header) {
	r.cfg.Metrics.Rejected.WithLabelValues(r.cfg.Name, reason).Inc()
	r.cfg.Log.Warn("rejected stream", "peer", peer, "reason", reason, "tunnel", h.Tunnel, "err", err)
	if s != nil {
		resetStream(s, hop.CodeRejected)
	}
}

func resetStream(s *quicgo.Stream, code quicgo.StreamErrorCode) {
	s.CancelRead(code)
	s.CancelWrite(code)
}

// nextHop opens a stream to route[0] and sends it the header for the rest
// of the route.
func (r *Relay) nextHop(ctx context.Context, h *hop.Header) (*rquic.Conn, *quicgo.Stream, error) {
	set := r.set.Load()
	if set.Relay(h.Route[0]) == nil {
		return nil, nil, fmt.Errorf("next hop %q is not a known relay", h.Route[0])
	}
	c, err := r.link(set, h.Route[0]).Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.OpenFlow(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("open stream to %s: %w", h.Route[0], err)
	}
	var buf [hop.PrefixLen + hop.MaxBodyLen]byte
	b, err := h.Append(buf[:0])
	if err == nil {
		_, err = s.Write(b)
	}
	if err != nil {
		resetStream(s, hop.CodeNextHop)
		return nil, nil, err
	}
	return c, s, nil
}

// nextHopEnd opens the next hop of a TCP flow over the chain's transport
// and sends it the header for the rest of the route.
func (r *Relay) nextHopEnd(ctx context.Context, h *hop.Header, transport v1alpha1.Transport) (end, error) {
	if transport != v1alpha1.TransportTLS {
		_, s, err := r.nextHop(ctx, h)
		if err != nil {
			return nil, err
		}
		return newStreamEnd(s), nil
	}
	set := r.set.Load()
	peer := set.Relay(h.Route[0])
	if peer == nil {
		return nil, fmt.Errorf("next hop %q is not a known relay", h.Route[0])
	}
	c, err := r.tl.Pool(peer.Name, peer.Spec.Endpoints).Get(ctx)
	if err != nil {
		return nil, err
	}
	out := &tlsEnd{c: c, done: func() { r.tl.Done(c) }}
	var buf [hop.PrefixLen + hop.MaxBodyLen]byte
	b, err := h.Append(buf[:0])
	if err == nil {
		_, err = c.Write(b)
	}
	if err != nil {
		out.abort()
		return nil, err
	}
	return out, nil
}

// middleTCP carries a TCP flow one hop further.
func (r *Relay) middleTCP(in end, h *hop.Header, t *v1alpha1.Tunnel) {
	fm, done := r.begin(h.Tunnel, "middle")
	defer done()
	out, err := r.onward(h, r.set.Load().ChainOf(t).Spec.Transport)
	if err != nil {
		r.flowError(h.Tunnel, "next_hop")
		r.cfg.Log.Warn("next hop unavailable", "tunnel", h.Tunnel, "next", h.Route[1], "err", err)
		in.fail(hop.CodeNextHop)
		return
	}
	pipe(in, out, fm.up, fm.down)
}

func (r *Relay) setupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.cfg.SetupTimeout)
}

// onward opens the next hop of a stream that passes through this relay (a
// TCP flow, a probe, a link request), sending it the header for the rest of
// the route.
func (r *Relay) onward(h *hop.Header, transport v1alpha1.Transport) (end, error) {
	next := *h
	next.Route = h.Route[1:]
	ctx, cancel := r.setupContext()
	defer cancel()
	return r.nextHopEnd(ctx, &next, transport)
}

// middle carries a UDP session one hop further.
func (r *Relay) middle(c *rquic.Conn, s *quicgo.Stream, h *hop.Header) {
	fm, done := r.begin(h.Tunnel, "middle")
	defer done()
	next := *h
	next.Route = h.Route[1:]
	ctx, cancel := r.setupContext()
	nc, ns, err := r.nextHop(ctx, &next)
	cancel()
	if err != nil {
		r.flowError(h.Tunnel, "next_hop")
		r.cfg.Log.Warn("next hop unavailable", "tunnel", h.Tunnel, "next", next.Route[0], "err", err)
		resetStream(s, hop.CodeNextHop)
		return
	}
	r.middleUDP(c, s, nc, ns, h.Tunnel, fm)
}

// errorsIsClosed reports errors that only say a socket was closed under us.
func errorsIsClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

// Identity is the relay's certificate and CA, for renewal.
func (r *Relay) Identity() *pki.Identity { return r.cfg.Identity }
