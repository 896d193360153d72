// Package relay is hoplink's data plane: a Relay accepts flows on the
// Tunnels that enter the network through it, carries flows of its peers one
// hop further, and dials targets for the chains it ends. What it may do is
// decided by the manifests it was given and nothing else: a peer's header is
// a request, checked against them at every hop (relay/admit).
//
// A Relay is lifecycle and wiring. The roles live in types of their own:
// the dispatcher (serve.go) admits what peers open and hands it on;
// tcpFlows, udpFlows, tunFlows and packetTunnels carry each protocol as
// entry, middle and exit; routeBook knows the routes; measurer probes,
// answers link requests and traces, and measures for the route controller;
// adminBackend answers the operator. They reach other relays through
// nexthop.Peers, the one owner of the QUIC and TLS endpoints.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/logs"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/probe"
	"github.com/hoplink/hoplink/relay/ratelog"
	"github.com/hoplink/hoplink/routectl"
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
	// MaxFlowsPerTunnel bounds those of one Tunnel (default a quarter of
	// MaxFlows), and MaxFlowsPerSource those of one Tunnel from one client
	// host at its entry (default a sixteenth of that, at least 64), so that
	// no Tunnel and no client can take every flow.
	MaxFlowsPerTunnel, MaxFlowsPerSource int
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
	// SeparateDialPort dials QUIC links from a port of the relay's own
	// rather than from the relay port: needed behind SNAT (a relay in a pod
	// network), where dialing from the relay port can take over the address
	// of a host-network relay on the same node.
	SeparateDialPort bool
	// Version is what the relay reports in its status.
	Version string
	// Board, when set, is what the admin API serves other clusters'
	// operators (adminapi.PathClusterSet); its owner keeps it current.
	Board *adminapi.Board
	// Egress, when set, is what exits may not reach for any Tunnel: the
	// node, for a host-network relay in a cluster (egress.NodePolicy).
	// Nil: whatever the Tunnels name, as standalone and local relays,
	// whose operator is their user.
	Egress *egress.Policy
}

// Relay is one running relay.
type Relay struct {
	cfg       Config
	set       atomic.Pointer[manifest.Set]
	env       *env
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ready     atomic.Bool
	drainOnce sync.Once // Drain's first call takes the relay out of service

	peers      *nexthop.Peers                     // the link layer
	congestion atomic.Pointer[nexthop.Congestion] // what the TLS links run
	routes     *routeBook
	measure    *measurer
	ctl        *routectl.Controller // when Config.Route
	tcp        *tcpFlows
	udp        *udpFlows
	tun        *tunFlows
	packets    *packetTunnels
	dispatch   *dispatcher

	mu      sync.Mutex
	tunnels map[string]*entryTunnel // open entries by Tunnel key
	failed  map[string]error        // entries that could not open, retried
	// formers are the Chain specs this relay ran before edits it took,
	// admitted for a while (formerSpecs).
	formers map[string][]manifest.Version
}

// entryTunnel is a Tunnel's open entry on this relay, with the spec it was
// opened with: a Tunnel whose spec changes is reopened.
type entryTunnel struct {
	spec   v1alpha1.TunnelSpec
	stop   func()
	listen string // where it listens, for status (listenText)
	// addrs are where it was to listen (entryListen): they change with
	// more than its spec (its relay turning sidecar), and it is reopened.
	addrs []string
}

// New checks the config and wires the relay's roles; Start binds the
// sockets.
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
	r := &Relay{cfg: cfg, tunnels: map[string]*entryTunnel{}, failed: map[string]error{}}
	r.set.Store(cfg.Manifests)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	perTunnel, perSource := defaultShares(cfg.MaxFlows)
	if cfg.MaxFlowsPerTunnel > 0 {
		perTunnel = min(cfg.MaxFlowsPerTunnel, cfg.MaxFlows)
	}
	if cfg.MaxFlowsPerSource > 0 {
		perSource = min(cfg.MaxFlowsPerSource, perTunnel)
	}
	r.env = &env{name: cfg.Name, log: cfg.Log, warn: ratelog.New(cfg.Log), m: cfg.Metrics, set: &r.set, setupTimeout: cfg.SetupTimeout,
		flows: newQuota(cfg.MaxFlows, perTunnel, perSource), egress: cfg.Egress, ctx: ctx, wg: &r.wg}
	return r, nil
}

// Name is the relay's RelayNode name.
func (r *Relay) Name() string { return r.cfg.Name }

// Ready reports whether every listener is open.
func (r *Relay) Ready() bool { return r.ready.Load() }

// Addr is the relay's bound QUIC address.
func (r *Relay) Addr() net.Addr { return r.peers.Addr() }

// Identity is the relay's certificate and CA, for renewal.
func (r *Relay) Identity() *pki.Identity { return r.cfg.Identity }

// Start opens the relay's listeners and its Tunnels' entries, and starts
// connecting to the peers its routes lead to.
func (r *Relay) Start() error {
	set := r.set.Load()
	self := set.Relay(r.cfg.Name)
	e := r.env
	cc, _ := r.congestionFor(set)
	// Built bottom up, each part whole: the link layer first, then the
	// roles with it, then the dispatcher with the roles, which Listen
	// makes the link layer's one way up before the first peer's stream can
	// arrive.
	peers := nexthop.New(nexthop.Options{
		Name:             e.name,
		Identity:         r.cfg.Identity,
		Listen:           net.JoinHostPort(self.Spec.Listen.Address, strconv.Itoa(int(self.Spec.Listen.Port))),
		SeparateDialPort: r.cfg.SeparateDialPort,
		Congestion:       cc,
		Metrics:          e.m,
		Log:              e.log,
	})
	hops := peers.Hops()
	r.peers = peers
	r.routes = newRouteBook(e, r.cfg.Route, peers)
	targets := probe.NewTargets(e.name, e.m, e.egress.Dialer())
	r.measure = &measurer{env: e, peers: peers, hops: hops, targets: targets, routes: r.routes, requests: newLinkRequests(),
		links: probe.NewLinks(probe.LinkOptions{Relay: e.name, Metrics: e.m, Peers: probePeers{peers}})}
	if r.cfg.Route {
		r.ctl = routectl.New(routectl.Options{Measurer: r.measure, Decide: r.routes.decide, Metrics: e.m.Route, Log: e.log})
	}
	r.tcp = &tcpFlows{env: e, hops: hops, routes: r.routes, targets: targets}
	r.udp = &udpFlows{env: e, hops: hops, routes: r.routes}
	r.tun = &tunFlows{env: e, tcp: r.tcp, udp: r.udp, noOffload: r.cfg.NoTUNOffload}
	r.packets = &packetTunnels{env: e, hops: hops, routes: r.routes, noOffload: r.cfg.NoTUNOffload, exits: map[string]*packetExit{}}
	r.dispatch = &dispatcher{env: e, tcp: r.tcp, udp: r.udp, packets: r.packets, measure: r.measure, ctl: r.ctl}
	peers.SetPeers(peersOf(set, r.cfg.Name))
	admin := adminapi.Handler(adminBackend{m: r.measure, status: r.status, board: r.cfg.Board})
	if err := peers.Listen(r.dispatch, admin); err != nil {
		return fmt.Errorf("RelayNode %q: spec.listen: %w", r.cfg.Name, err)
	}
	r.packets.sync(set)
	// A Tunnel that cannot open (its port taken, its device refused) is
	// reported and retried; it keeps no other Tunnel from serving.
	for _, t := range set.EntryTunnels(r.cfg.Name) {
		r.openTunnel(t)
	}
	e.spawn(r.retryTunnels)
	e.spawn(func() { e.fair.run(e.ctx) })
	e.spawn(r.measure.probeLoop)
	e.spawn(r.watchCertificates)
	r.routingUpdated(set)
	r.ready.Store(true)
	e.m.Ready.WithLabelValues(r.cfg.Name).Set(1)
	e.log.Info("relay started", "listen", peers.Addr().String(), "peers", set.NextHops(r.cfg.Name))
	return nil
}

// routingUpdated applies a manifest set to routing: the routes known, and
// the chains this relay's route controller routes.
func (r *Relay) routingUpdated(set *manifest.Set) {
	r.routes.update(set)
	if r.ctl == nil {
		return
	}
	var mine []*v1alpha1.Chain
	for _, c := range set.Chains {
		if c.Spec.Entry == r.cfg.Name {
			mine = append(mine, c)
		}
	}
	r.ctl.Set(mine, r.routes.current)
}

// Update applies new manifests to a running relay. New flows follow them at
// once; flows already open finish on the path they started on, and peers
// that have not taken a Chain's edit yet may still send new flows along
// the spec this relay ran before, for versionGrace. Entries of
// Tunnels that are gone or whose spec changed close (their open TCP flows
// go on), and new ones open. A Tunnel that cannot open is reported in the
// returned error and does not stop the others. The relay's own listen
// address is fixed at Start.
func (r *Relay) Update(set *manifest.Set) error {
	if set.Relay(r.cfg.Name) == nil {
		return fmt.Errorf("RelayNode %q is no longer in the manifests; keeping the previous ones", r.cfg.Name)
	}
	r.mu.Lock()
	r.formers = formerSpecs(r.formers, r.set.Load(), set, time.Now())
	set = set.WithVersions(r.formers)
	r.set.Store(set)
	r.mu.Unlock()
	if cc, changed := r.congestionFor(set); changed {
		r.peers.SetCongestion(cc)
	}
	r.peers.SetPeers(peersOf(set, r.cfg.Name))
	// Peers the manifests dropped lose their connections; TLS sessions
	// stop resuming under CAs an Identity().Update replaced.
	r.peers.Recheck(true)
	r.routingUpdated(set)
	r.packets.sync(set)
	r.env.limits.sync(set)
	want := map[string]*v1alpha1.Tunnel{}
	for _, t := range set.EntryTunnels(r.cfg.Name) {
		want[manifest.Key(t.Namespace, t.Name)] = t
	}
	r.mu.Lock()
	var stops []func()
	for key, et := range r.tunnels {
		if t := want[key]; t == nil || !equality.Semantic.DeepEqual(et.spec, t.Spec) || !slices.Equal(et.addrs, r.env.listenAddrs(t)) {
			stops = append(stops, et.stop)
			delete(r.tunnels, key)
			if t == nil {
				r.cfg.Metrics.TunnelOpen.DeleteLabelValues(r.cfg.Name, key)
			}
			r.cfg.Log.Info("tunnel closed", "tunnel", key)
		}
	}
	for key := range r.failed {
		if want[key] == nil {
			delete(r.failed, key)
			r.cfg.Metrics.TunnelOpen.DeleteLabelValues(r.cfg.Name, key)
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
		if !open && !r.env.draining.Load() {
			errs = append(errs, r.openTunnel(t))
		}
	}
	return errors.Join(errs...)
}

// tunnelRetry spaces the attempts to open an entry that failed.
const tunnelRetry = 5 * time.Second

// retryTunnels opens again, every tunnelRetry, the entries that failed:
// a port another process held may be free now.
func (r *Relay) retryTunnels() {
	t := time.NewTicker(tunnelRetry)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.env.ctx.Done():
			return
		}
		if r.env.draining.Load() {
			continue
		}
		set := r.set.Load()
		r.mu.Lock()
		var retry []*v1alpha1.Tunnel
		for key := range r.failed {
			if tn := set.Tunnel(key); tn != nil && r.tunnels[key] == nil {
				retry = append(retry, tn)
			}
		}
		r.mu.Unlock()
		for _, tn := range retry {
			r.openTunnel(tn)
		}
	}
}

// status is what the relay reports to the operator: its entries, open or
// why not, and its problems.
// TunnelErrors are the entries this relay should open and could not, by
// Tunnel key, with why.
func (r *Relay) TunnelErrors() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.failed))
	for k, err := range r.failed {
		out[k] = err.Error()
	}
	return out
}

// openTunnel opens a Tunnel's entry, or records and reports why it could
// not (the error it returns): the entry is then retried.
func (r *Relay) openTunnel(t *v1alpha1.Tunnel) error {
	key := manifest.Key(t.Namespace, t.Name)
	err := r.open(t)
	r.mu.Lock()
	_, had := r.failed[key]
	if err != nil {
		r.failed[key] = err
	} else {
		delete(r.failed, key)
	}
	r.mu.Unlock()
	r.cfg.Metrics.TunnelOpen.WithLabelValues(r.cfg.Name, key).Set(boolGauge(err == nil))
	if err != nil && !had {
		r.cfg.Log.Error("cannot open the Tunnel's entry; the relay serves the others and retries it", "tunnel", key,
			"retry_every", tunnelRetry, "err", err)
	}
	return err
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// open opens a Tunnel's entry with the role of its protocol.
func (r *Relay) open(t *v1alpha1.Tunnel) error {
	addrs, loopbacks := r.env.entryListen(t)
	key := manifest.Key(t.Namespace, t.Name)
	var stop func()
	var bound []string
	var err error
	switch t.Spec.Protocol {
	case v1alpha1.ProtocolTCP:
		stop, bound, err = r.tcp.listen(t, addrs, loopbacks)
	case v1alpha1.ProtocolUDP:
		stop, bound, err = r.udp.listen(t, addrs, loopbacks)
	case v1alpha1.ProtocolTUN:
		stop, err = r.openTUN(t, key)
		if err != nil {
			return fmt.Errorf("Tunnel %q: %w", key, err)
		}
	default:
		return fmt.Errorf("Tunnel %q: spec.protocol %q is not supported", key, t.Spec.Protocol)
	}
	if err != nil {
		return fmt.Errorf("Tunnel %q: spec.listen: %w", key, err)
	}
	addr := listenText(bound)
	r.mu.Lock()
	r.tunnels[key] = &entryTunnel{spec: *t.Spec.DeepCopy(), stop: stop, listen: addr, addrs: addrs}
	r.mu.Unlock()
	chain := r.set.Load().ChainOf(t)
	route := logs.Route(manifest.Route(chain))
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

// sidecarLoopbacks are where a Tunnel that enters at a sidecar relay and
// names no spec.listen.address listens: its pod's loopbacks, so an app
// that dials localhost reaches it whichever of 127.0.0.1 and ::1 it tries
// first. A pod without one (IPv6 disabled: no ::1) is served on the other.
var sidecarLoopbacks = []string{"127.0.0.1", "::1"}

// entryListen is where a Tunnel's entry listens: spec.listen's address and
// port; a sidecar relay's loopbacks (sidecarLoopbacks) where it names no
// address, and then loopbacks is true. Of those, only the loopbacks whose
// clients spec.listen.allowedSources admit (loopbackAdmitted), as long as
// one is: a listener that took an app's connection only to reset it would
// keep the app, dialing localhost, from falling back to the other loopback.
func (e *env) entryListen(t *v1alpha1.Tunnel) (addrs []string, loopbacks bool) {
	l := t.Spec.Listen
	if l == nil {
		return nil, false
	}
	port := strconv.Itoa(int(l.Port))
	if l.Address == "" {
		if self := e.set.Load().Relay(e.name); self != nil && self.Spec.IsSidecar() {
			sources, err := manifest.AllowedSources(l)
			for _, a := range sidecarLoopbacks {
				if err == nil && loopbackAdmitted(sources, a) {
					addrs = append(addrs, net.JoinHostPort(a, port))
				}
			}
			if len(addrs) == 0 { // none admitted: the entry refuses everyone anyway
				for _, a := range sidecarLoopbacks {
					addrs = append(addrs, net.JoinHostPort(a, port))
				}
			}
			return addrs, true
		}
	}
	return []string{net.JoinHostPort(l.Address, port)}, false
}

// loopbackAdmitted says whether a Tunnel whose allowed sources are sources
// (nil: every one) admits a client of loopback address a: for 127.0.0.1,
// any of 127.0.0.0/8, where the pod's apps may send from; for ::1, itself.
func loopbackAdmitted(sources []netip.Prefix, a string) bool {
	if sources == nil {
		return true
	}
	addr, err := netip.ParseAddr(a)
	if err != nil {
		return true
	}
	clients := netip.PrefixFrom(addr, addr.BitLen())
	if addr.Is4() {
		clients = netip.MustParsePrefix("127.0.0.0/8")
	}
	for _, p := range sources {
		if p.Overlaps(clients) {
			return true
		}
	}
	return false
}

// listenAddrs are where a Tunnel's entry is to listen (entryListen).
func (e *env) listenAddrs(t *v1alpha1.Tunnel) []string {
	addrs, _ := e.entryListen(t)
	return addrs
}

// listenEach opens a socket at each of addrs, and says at which it did.
// With loopbacks, one whose address or family this host lacks is left
// out, as long as another opens; any other failure closes those opened.
func listenEach[T io.Closer](addrs []string, loopbacks bool, listen func(addr string) (T, error)) ([]T, []string, error) {
	var out []T
	var bound []string
	var lacking []error
	for _, a := range addrs {
		c, err := listen(a)
		switch {
		case err == nil:
			out = append(out, c)
			bound = append(bound, a)
			continue
		case loopbacks && (errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT)):
			lacking = append(lacking, err)
			continue
		}
		for _, c := range out {
			c.Close()
		}
		return nil, nil, err
	}
	if len(out) == 0 && len(lacking) == 0 {
		return nil, nil, errors.New("no address to listen on")
	}
	if len(out) == 0 {
		return nil, nil, errors.Join(lacking...)
	}
	return out, bound, nil
}

// listenText names where an entry listens, for status and logs: its
// address, or localhost:PORT for both loopbacks.
func listenText(bound []string) string {
	switch len(bound) {
	case 0:
		return ""
	case 1:
		return bound[0]
	}
	_, port, _ := net.SplitHostPort(bound[0])
	return net.JoinHostPort("localhost", port)
}

// openTUN opens a tun Tunnel's device, with its address and routes, in the
// role of its mode.
func (r *Relay) openTUN(t *v1alpha1.Tunnel, key string) (stop func(), err error) {
	u := t.Spec.TUN
	addr, err := netip.ParsePrefix(u.Address)
	if err != nil {
		return nil, fmt.Errorf("spec.tun.address: %w", err)
	}
	var routes []netip.Prefix
	for _, s := range u.Routes {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("spec.tun.routes: %w", err)
		}
		routes = append(routes, p)
	}
	if u.Mode == v1alpha1.TunPacket {
		return r.packets.openEntry(t, key, addr, routes)
	}
	return r.tun.open(t, key, addr, routes)
}

// DefaultDrainTimeout is how long a relay told to stop lets its open flows
// go on (hoplink relay --drain-timeout); the DaemonSet's grace period
// leaves it a few seconds more.
const DefaultDrainTimeout = v1alpha1.DefaultDrainSeconds * time.Second

// certCheck is how often a relay looks for connections whose peer's
// certificate expired, and exports its own certificate's expiry.
const certCheck = time.Second

// watchCertificates closes connections whose peer's certificate expired,
// within certCheck of the expiry (a connection would otherwise outlive
// the certificate it was made with), and exports when the relay's own
// expires.
func (r *Relay) watchCertificates() {
	t := time.NewTicker(certCheck)
	defer t.Stop()
	for {
		r.cfg.Metrics.CertExpiry.WithLabelValues(r.cfg.Name).Set(float64(r.cfg.Identity.NotAfter().Unix()))
		r.peers.Recheck(false)
		select {
		case <-t.C:
		case <-r.env.ctx.Done():
			return
		}
	}
}

// drainPoll is how often Drain looks whether the open flows ended.
const drainPoll = 20 * time.Millisecond

// Drain takes the relay out of service without cutting a flow. It turns
// not ready; closes its TCP Tunnels' listeners, so clients connecting now
// are refused at once and can retry elsewhere; refuses every new flow
// (UDP sessions, a tun device's flows, peers' streams, reset with
// CodeShutdown); tells its peers, which then send it no new flows and
// route around it; and waits until the open TCP flows end or ctx does.
// UDP and packet sessions, which have no end of their own, are carried
// meanwhile. It returns how many TCP flows were still open. Close ends
// what is left.
func (r *Relay) Drain(ctx context.Context) (open int) {
	r.drainOnce.Do(func() {
		r.env.draining.Store(true)
		r.ready.Store(false)
		r.cfg.Metrics.Ready.WithLabelValues(r.cfg.Name).Set(0)
		r.mu.Lock()
		var stops []func()
		for key, et := range r.tunnels {
			if et.spec.Protocol == v1alpha1.ProtocolTCP {
				stops = append(stops, et.stop)
				delete(r.tunnels, key)
			}
		}
		r.mu.Unlock()
		for _, stop := range stops {
			stop()
		}
		// A draining entry takes no new flow, so its chains' routes no
		// longer matter; routing on would move them away from peers that
		// drain too (every relay of hoplink local at Ctrl-C) and log a
		// route change and a warning about a network going away on purpose.
		if r.ctl != nil {
			r.ctl.Close()
		}
		if r.peers != nil {
			r.peers.Drain()
		}
		r.cfg.Log.Info("draining: no new flows; waiting for the open TCP flows", "open", r.env.openTCP.Load())
	})
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		if open = int(r.env.openTCP.Load()); open == 0 {
			r.cfg.Log.Info("drained: every flow ended")
			if r.peers != nil {
				if n := r.peers.Settle(ctx); n > 0 {
					r.cfg.Log.Info("drain ended before every peer read what this relay sent", "peers", n)
				}
			}
			return 0
		}
		select {
		case <-ctx.Done():
			r.cfg.Log.Info("drain ended with TCP flows open", "open", open)
			return open
		case <-t.C:
		}
	}
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
	if r.packets != nil {
		r.packets.close()
	}
	r.cancel()
	var err error
	if r.peers != nil {
		err = r.peers.Close()
	}
	r.wg.Wait()
	return err
}
