package quic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/ratelog"
)

// Options configure an Endpoint.
type Options struct {
	// Name of this relay; the metrics' relay label.
	Name     string
	Identity *pki.Identity
	// Listen is the UDP host:port for QUIC; peers are dialed from the same
	// socket.
	Listen string
	// SeparateDialPort dials links from a UDP socket of their own, on a
	// port the kernel picks, instead of the relay port. A relay in a pod
	// network behind its node's SNAT needs it: dialing from the relay port,
	// it shows up at the node's address with that port, the very address
	// of a host-network relay on that node, and the NAT then hands that
	// relay's incoming connections to the pod. Off, a relay dials from its
	// relay port, as peers and link emulators that key on it expect.
	SeparateDialPort bool
	// MaxStreams bounds the flows a peer may have open at once on one
	// connection (quic-go's MaxIncomingStreams), not on all of them: a peer
	// may hold MaxConns connections. 0 means DefaultMaxStreams.
	MaxStreams int64
	// MaxConns bounds the connections one peer may hold to this relay (it
	// dialed them); past it the idlest closes (Endpoint.bound). Nil means
	// DefaultMaxConns.
	MaxConns func(peer string) int
	// KnownPeer says whether a relay of that name may connect; a peer with a
	// valid certificate that no manifest names is turned away.
	KnownPeer func(name string) bool
	// Handler serves a stream a peer opened. It owns the stream.
	Handler func(c *Conn, s *quicgo.Stream)
	// OnProbeEcho receives the answers to link probes sent on connections
	// this endpoint dialed (see Conn.SendProbe).
	OnProbeEcho func(peer string, payload []byte)
	// OnRejected is told of every peer handshake refused.
	OnRejected func(remote net.Addr, err error)
	// OnPeerLost is told when a peer's control connection timed out: the
	// peer stopped answering.
	OnPeerLost func(peer string)
	// OnPeerDraining is told when a peer says it drains (see Drain).
	OnPeerDraining func(peer string)
	Metrics        *metrics.Metrics
	Log            *slog.Logger
}

// Endpoint is a relay's QUIC side: it accepts peers and dials them.
type Endpoint struct {
	opts Options
	warn *ratelog.Logger // for what peers can make the relay log
	udp  *net.UDPConn
	// dialUDP and dialTr carry the connections this relay dials: udp and
	// tr themselves unless SeparateDialPort.
	dialUDP *net.UDPConn
	dialTr  *quicgo.Transport
	tr      *quicgo.Transport
	ln      *quicgo.Listener
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu    sync.Mutex
	links map[linkKey]*Link
	// replicaLost holds the replicas (key: peer and replica) a link lost
	// its connection to and has not reconnected since.
	replicaLost sync.Map
	// silent holds the peers that answered no probe of their last round.
	silent sync.Map
	conns  map[*Conn]struct{}
	// drainers holds the connections on which a peer said it drains, by
	// peer, while they last: a peer that restarts connects anew. Only its
	// links count (drainNotice).
	drainers map[string][]*Conn

	draining atomic.Bool // this relay drains
	red      *redundancy // where lone packets go twice
}

// Listen binds the UDP socket and starts accepting peers.
func Listen(opts Options) (*Endpoint, error) {
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	addr, err := net.ResolveUDPAddr("udp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay listen address %q: %w", opts.Listen, err)
	}
	udp, err := net.ListenUDP("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	handshakes := rate.NewLimiter(handshakeRate, 2*handshakeRate)
	resetKey, err := opts.Identity.DeriveKey("stateless reset")
	if err != nil {
		udp.Close()
		return nil, err
	}
	dialUDP := udp
	if opts.SeparateDialPort {
		if dialUDP, err = net.ListenUDP("udp", &net.UDPAddr{IP: addr.IP, Zone: addr.Zone}); err != nil {
			udp.Close()
			return nil, fmt.Errorf("relay dial socket: %w", err)
		}
	}
	copies := opts.Metrics.RedundantCopies.WithLabelValues(opts.Name)
	red := newRedundancy(func(addr netip.AddrPort, on bool, loss float64) {
		if on {
			opts.Log.Info("link loses packets: lone packets go twice", "remote", addr, "loss", fmt.Sprintf("%.2f%%", 100*loss))
		} else {
			opts.Log.Info("lone packets go once again", "remote", addr)
		}
	}, copies.Inc)
	transport := func(c *net.UDPConn) *quicgo.Transport {
		conn := &lossyConn{UDPConn: c, red: red, lost: func(reason string) {
			opts.Metrics.SendLost.WithLabelValues(opts.Name, reason).Inc()
		}}
		return &quicgo.Transport{Conn: withGRO(conn), StatelessResetKey: (*quicgo.StatelessResetKey)(&resetKey),
			// quic-go takes datagrams of up to path MTU - 37 bytes. A
			// packet carrying one (1 byte flags, the connection ID, a
			// 2-byte packet number, 1 byte frame type, 16 bytes AEAD tag)
			// is exactly full with 17-byte IDs: with the default 4 it is
			// 13 bytes short, and a short packet ends a GSO batch, one
			// sendmsg per datagram. Packet numbers stay 2 bytes while
			// fewer than 32768 packets are unacknowledged, which quic-go's
			// 10000-packet congestion window bounds.
			ConnectionIDLength: datagramConnIDLen}
	}
	e := &Endpoint{
		opts:    opts,
		udp:     udp,
		dialUDP: dialUDP,
		tr:      transport(udp),
		links:   map[linkKey]*Link{},
		conns:   map[*Conn]struct{}{},
		red:     red,
	}
	// Past a rate of new connections, a client must prove its address (a
	// Retry, one round trip) before any handshake work: a flood of spoofed
	// Initials costs little.
	e.tr.VerifySourceAddress = func(net.Addr) bool { return !handshakes.Allow() }
	e.dialTr = e.tr
	if opts.SeparateDialPort {
		e.dialTr = transport(dialUDP)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.warn = ratelog.New(opts.Log)
	tlsConf := opts.Identity.ServerConfig(func(remote net.Addr, err error) {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected peer certificate", "remote", remote, "err", err)
		e.rejected(remote, err)
	})
	e.ln, err = e.tr.Listen(tlsConf, listenConfig(opts.MaxStreams))
	if err != nil {
		udp.Close()
		if dialUDP != udp {
			dialUDP.Close()
		}
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	e.reportBuffers()
	e.wg.Add(2)
	go e.accept()
	go e.judgeLoss()
	return e, nil
}

// judgeLoss samples every connection's loss four times a second, which
// decides where lone packets go twice (redundant.go), and tells each busy
// connection's peer what it sent, for the peer's answer to say what
// arrived (counts.go).
func (e *Endpoint) judgeLoss() {
	defer e.wg.Done()
	t := time.NewTicker(lossSample)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-t.C:
			conns := e.allConns()
			e.red.sample(conns, now)
			for _, c := range conns {
				c.reportSent()
			}
		}
	}
}

// reportBuffers exports the socket buffers quic-go obtained (it asks for
// 7 MiB; a relay without CAP_NET_ADMIN gets what the node's
// net.core.rmem_max and wmem_max allow, and a small receive buffer drops
// datagrams in bursts).
func (e *Endpoint) reportBuffers() {
	raw, err := e.udp.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		for dir, opt := range map[string]int{"receive": unix.SO_RCVBUF, "send": unix.SO_SNDBUF} {
			if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt); err == nil {
				e.opts.Metrics.UDPBuffer.WithLabelValues(e.opts.Name, dir).Set(float64(n))
			}
		}
	})
}

// handshakeRate is how many new connections a second a relay accepts
// without a Retry: far more than its peers ever make.
const handshakeRate = 100

// datagramConnIDLen makes a packet with the largest datagram full-size.
const datagramConnIDLen = 17

// Addr is the bound UDP address.
func (e *Endpoint) Addr() net.Addr { return e.udp.LocalAddr() }

func (e *Endpoint) handshake(direction, result string) {
	e.opts.Metrics.Handshakes.WithLabelValues(e.opts.Name, direction, result).Inc()
}

func (e *Endpoint) accept() {
	defer e.wg.Done()
	for {
		qc, err := e.ln.Accept(e.ctx)
		if err != nil {
			return
		}
		peer, err := pki.PeerName(qc.ConnectionState().TLS)
		if err == nil && !e.opts.KnownPeer(peer) {
			err = fmt.Errorf("relay %q is in no manifest this relay knows", peer)
		}
		if err != nil {
			e.handshake("accept", "rejected")
			e.warn.Warn("rejected peer", "remote", qc.RemoteAddr(), "err", err)
			e.rejected(qc.RemoteAddr(), err)
			qc.CloseWithError(1, "unknown relay")
			continue
		}
		e.handshake("accept", "ok")
		c := newConn(qc, peer, false)
		if !e.track(c) {
			qc.CloseWithError(0, "relay shutting down")
			return
		}
		if e.bound(c) {
			e.untrack(c)
			continue
		}
		e.opts.Log.Debug("peer connected", "peer", peer, "remote", qc.RemoteAddr())
		e.wg.Add(2)
		go func() {
			defer e.wg.Done()
			c.runDatagrams(e)
		}()
		go func() {
			defer e.wg.Done()
			// Untrack only once the connection is gone, so Close, which
			// closes every tracked connection, cannot miss one.
			defer e.untrack(c)
			for {
				s, err := qc.AcceptStream(qc.Context())
				if err != nil {
					return
				}
				c.serving.Add(1)
				c.touch()
				go func() {
					defer func() {
						c.touch()
						c.serving.Add(-1)
					}()
					e.opts.Handler(c, s)
				}()
			}
		}()
	}
}

// MaxTunnelLinks bounds the Tunnel links a relay dials to one peer (or one
// replica of it); the flows of Tunnels past it share the link of another
// (Endpoint.link). With the control link, a relay process holds at most
// 1 + MaxTunnelLinks connections to a peer.
const MaxTunnelLinks = 15

// DefaultMaxConns is the connections a peer may hold when Options.MaxConns
// says nothing: as many as one relay process dials, twice over, since a
// relay that restarted reconnects before its old connections are gone.
const DefaultMaxConns = 2 * (1 + MaxTunnelLinks)

// bound closes connections of c's peer (those it dialed to this relay)
// past the peer's bound, c just accepted among them, and reports whether
// c itself closed. Each connection may make this relay buffer up to its
// flow-control window, so connections without bound were memory without
// bound. The idlest close first (idleness.closesBefore), and never one
// serving a stream: c serves none yet, so it closes rather than a busy
// one, and a bound that shrank (a Tunnel removed) leaves flows to finish.
// A connection the peer used as its link closes only once every one the
// peer made and never used is gone.
func (e *Endpoint) bound(c *Conn) bool {
	limit := DefaultMaxConns
	if e.opts.MaxConns != nil {
		limit = max(1, e.opts.MaxConns(c.Peer))
	}
	e.mu.Lock()
	var peers []idleness
	for o := range e.conns {
		if o.Peer == c.Peer && o.Context().Err() == nil {
			peers = append(peers, o.idleness())
		}
	}
	e.mu.Unlock()
	if len(peers) <= limit {
		return false
	}
	slices.SortFunc(peers, idleness.closesBefore)
	self := false
	for _, v := range peers[:len(peers)-limit] {
		if v.busy {
			break
		}
		e.opts.Metrics.ConnsEvicted.WithLabelValues(e.opts.Name, c.Peer).Inc()
		e.warn.Warn("peer holds too many connections: the idlest closes", "peer", c.Peer, "limit", limit, "remote", v.c.RemoteAddr())
		v.c.CloseWithError(0, "too many connections from this relay")
		self = self || v.c == c
	}
	return self
}

func (e *Endpoint) echo(peer string, payload []byte) {
	if e.opts.OnProbeEcho != nil {
		e.opts.OnProbeEcho(peer, payload)
	}
}

func (e *Endpoint) rejected(remote net.Addr, err error) {
	if e.opts.OnRejected != nil {
		e.opts.OnRejected(remote, err)
	}
}

// Drain tells every peer connected now that this relay takes no new flows;
// from now on it answers their probes with the same news. Open flows and
// connections go on.
func (e *Endpoint) Drain() {
	e.draining.Store(true)
	msg := hop.AppendDatagram(nil, hop.DrainFlow, nil)
	for _, c := range e.allConns() {
		c.SendDatagram(msg)
	}
}

// settleResend is how often Settle repeats its news (a datagram may be
// lost).
const settleResend = 100 * time.Millisecond

// Settle, once a drain saw every flow end, tells the peers so (DoneFlow)
// and waits until each connection up now was closed by its peer, which it
// does once it read all its flows on it; or until ctx ends. Closing first
// would discard what a peer received but has not read. It returns how
// many connections were still up.
func (e *Endpoint) Settle(ctx context.Context) (open int) {
	conns := e.allConns()
	msg := hop.AppendDatagram(nil, hop.DoneFlow, nil)
	t := time.NewTicker(settleResend)
	defer t.Stop()
	for {
		live := conns[:0]
		for _, c := range conns {
			if c.Context().Err() == nil {
				c.SendDatagram(msg)
				live = append(live, c)
			}
		}
		if conns = live; len(conns) == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return len(conns)
		case <-t.C:
		}
	}
}

// Recheck closes every connection whose peer no longer holds: its
// certificate expired, or (full) the manifests no longer name it. Flows on
// such a connection end. It returns how many it closed.
func (e *Endpoint) Recheck(full bool) int {
	n := 0
	now := time.Now()
	for _, c := range e.allConns() {
		var err error
		st := c.ConnectionState().TLS
		switch {
		case len(st.PeerCertificates) > 0 && now.After(st.PeerCertificates[0].NotAfter):
			err = fmt.Errorf("its certificate expired at %s", st.PeerCertificates[0].NotAfter.UTC().Format(time.RFC3339))
		case full && e.opts.KnownPeer != nil && !e.opts.KnownPeer(c.Peer):
			err = errors.New("the manifests no longer name it")
		}
		if err != nil {
			e.opts.Log.Warn("closing the connection to a peer that no longer holds", "peer", c.Peer, "transport", "quic", "err", err)
			c.CloseWithError(0, "peer no longer trusted")
			n++
		}
	}
	return n
}

// allConns is every connection up now, accepted and dialed.
func (e *Endpoint) allConns() []*Conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	conns := make([]*Conn, 0, len(e.conns)+len(e.links))
	for c := range e.conns {
		conns = append(conns, c)
	}
	for _, l := range e.links {
		if c := l.Live(); c != nil {
			conns = append(conns, c)
		}
	}
	return conns
}

// What became of a peer's drain news on a connection (Conn.heard).
const (
	heardIgnored = 1 + iota
	heardHonoured
)

// drainNotice takes a peer's news, on c, that it drains. The connection
// itself takes no new flows either way; the peer as a whole counts as
// draining only when c is its link: a connection this relay dialed, or,
// while this relay has no live link of its own to the peer (which would
// hear the news itself), one that carried the peer's admitted flows. A
// connection made merely with the peer's certificate cannot make the
// relay stop using a healthy peer, and a relay of many processes under
// one name (a DaemonSet) that drains one of them does not stop the
// others' flows.
func (e *Endpoint) drainNotice(c *Conn) {
	if c.heard.Load() == heardHonoured {
		return
	}
	e.mu.Lock()
	link := c.dialed || (c.admitted.Load() && !e.dialsLocked(c.Peer))
	if link {
		if e.drainers == nil {
			e.drainers = map[string][]*Conn{}
		}
		e.drainers[c.Peer] = append(e.drainers[c.Peer], c)
		c.heard.Store(heardHonoured)
	}
	e.mu.Unlock()
	notices := e.opts.Metrics.DrainNotices
	if !link {
		if c.heard.CompareAndSwap(0, heardIgnored) {
			notices.WithLabelValues(e.opts.Name, c.Peer, "ignored").Inc()
			e.opts.Log.Debug("peer draining on a connection that is not its link: only that connection drains", "peer", c.Peer, "remote", c.RemoteAddr())
		}
		return
	}
	notices.WithLabelValues(e.opts.Name, c.Peer, "honoured").Inc()
	e.opts.Log.Info("peer draining: no new flows through it", "peer", c.Peer)
	if e.opts.OnPeerDraining != nil {
		e.opts.OnPeerDraining(c.Peer)
	}
}

// dialsLocked says whether a connection this relay dialed to peer is up;
// e.mu is held.
func (e *Endpoint) dialsLocked(peer string) bool {
	for k, l := range e.links {
		if k.peer == peer && l.Live() != nil {
			return true
		}
	}
	return false
}

// PeerDraining reports whether peer said it drains on one of its links
// (see drainNotice) that is still up.
func (e *Endpoint) PeerDraining(peer string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	live := e.drainers[peer][:0]
	for _, c := range e.drainers[peer] {
		if c.Context().Err() == nil {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		delete(e.drainers, peer)
		return false
	}
	e.drainers[peer] = live
	return true
}

func (e *Endpoint) dropped(reason string) {
	e.opts.Metrics.UDPDropped.WithLabelValues(e.opts.Name, "", reason).Inc()
}

func (e *Endpoint) track(c *Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return false
	}
	e.conns[c] = struct{}{}
	return true
}

func (e *Endpoint) untrack(c *Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// linkKey names a link: the peer, the class of flows it carries, and for
// a peer with replicas (a sidecar relay) the replica's address.
type linkKey struct{ peer, class, replica string }

// Control is the class of a relay's control link to a peer: link probes,
// link requests and traces.
const Control = ""

// Link returns the link to a peer for a class of flows, creating it (and
// starting to dial) on first use. Each Tunnel's flows ride a link of their
// own (its class is the Tunnel's key): data a stream received but its
// relay has not yet read counts against the connection's flow-control
// window, so on a shared connection one Tunnel's stalled readers would
// stall every other Tunnel between the same two relays. A class link that
// carries no stream for idleLink closes; the control link stays up.
func (e *Endpoint) Link(peer, class string, addrs []string) *Link {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.link(linkKey{peer, class, ""}, addrs)
}

// Replica returns the link to one replica of a peer whose relays are
// replicas of one name (a sidecar RelayNode): each replica has links of
// its own, so the previous hop spreads flows over them and loses only a
// dead replica's flows.
func (e *Endpoint) Replica(peer, class, addr string) *Link {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.link(linkKey{peer, class, addr}, []string{addr})
}

// link returns or starts the link of k; e.mu is held. A Tunnel past the
// peer's (or replica's) MaxTunnelLinks shares the Tunnel link with the
// fewest streams open: the peer bounds the connections it takes from this
// relay, and one more would cost an idle link of another Tunnel.
func (e *Endpoint) link(k linkKey, addrs []string) *Link {
	if l := e.links[k]; l != nil {
		return l
	}
	if k.class != Control {
		var least *Link
		n := 0
		for o, l := range e.links {
			if o.peer == k.peer && o.replica == k.replica && o.class != Control {
				n++
				if least == nil || l.open.Load() < least.open.Load() {
					least = l
				}
			}
		}
		if n >= MaxTunnelLinks {
			return least
		}
	}
	l := newLink(e, k.peer, k.class, addrs)
	l.replica = k.replica
	e.links[k] = l
	if e.ctx.Err() == nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			l.run()
		}()
	}
	return l
}

// forget removes a class link that closed for being idle.
func (e *Endpoint) forget(l *Link) {
	e.mu.Lock()
	if k := (linkKey{l.peer, l.class, l.replica}); e.links[k] == l {
		delete(e.links, k)
	}
	e.mu.Unlock()
}

// Retire ends the replica links of peer whose address is not in keep (a
// replica that turned not-ready or left): new flows no longer take them,
// and each closes once its open flows are done.
func (e *Endpoint) Retire(peer string, keep []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, l := range e.links {
		if k.peer == peer && k.replica != "" && !slices.Contains(keep, k.replica) {
			l.retired.Store(true)
			delete(e.links, k)
			e.replicaLost.Delete(linkKey{peer, "", k.replica})
		}
	}
}

// ReplicaUp says whether one replica is reachable now: its control link
// is connected, and no link to it lost its connection since it last
// connected (a dead replica's links notice at different moments).
func (e *Endpoint) ReplicaUp(peer, addr string) bool {
	if _, lost := e.replicaLost.Load(linkKey{peer, "", addr}); lost {
		return false
	}
	c := e.replicaConn(peer, addr)
	return c != nil && !c.Draining()
}

// ReplicaDraining reports whether a replica said it drains on the
// connection up now.
func (e *Endpoint) ReplicaDraining(peer, addr string) bool {
	c := e.replicaConn(peer, addr)
	return c != nil && c.Draining()
}

func (e *Endpoint) replicaConn(peer, addr string) *Conn {
	e.mu.Lock()
	l := e.links[linkKey{peer, Control, addr}]
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Live()
}

// replicaState records that a link to a replica connected or lost its connection.
func (e *Endpoint) replicaState(l *Link, up bool) {
	if l.replica == "" {
		return
	}
	k := linkKey{l.peer, "", l.replica}
	if up {
		e.replicaLost.Delete(k)
	} else {
		e.replicaLost.Store(k, true)
	}
}

// SetAddrs gives every link to a peer the peer's current endpoints.
func (e *Endpoint) SetAddrs(peer string, addrs []string) {
	e.mu.Lock()
	var ls []*Link
	for k, l := range e.links {
		if k.peer == peer && k.replica == "" {
			ls = append(ls, l)
		}
	}
	e.mu.Unlock()
	for _, l := range ls {
		l.SetAddrs(addrs)
	}
}

// Live returns the control connection to a peer this endpoint dials, if it
// is up now; it neither creates a link nor waits.
// A peer with replicas answers with the first of them connected.
// Loss sums what the connections this relay dialed to peer sent, in
// packets, and lost (quic-go's counts, over each connection's life; since
// copies made up for the link's loss, the counts that turned them on,
// until the link shows itself clean without copies).
func (e *Endpoint) Loss(peer string) (sent, lost uint64) {
	e.mu.Lock()
	var links []*Link
	for k, l := range e.links {
		if k.peer == peer {
			links = append(links, l)
		}
	}
	e.mu.Unlock()
	var hidden counts
	for _, l := range links {
		if c := l.Live(); c != nil {
			cur := c.lossCounts()
			sent += cur.sent
			lost += cur.lost
			if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok {
				if j, on := e.red.hidden(ua.AddrPort()); on {
					hidden = j
				}
			}
		}
	}
	// Since lone packets went twice, quic-go's counts hardly hold the loss
	// the copies made up for; the link still has it.
	if hidden.sent > 0 && hidden.lost*max(sent, 1) > lost*hidden.sent {
		return hidden.sent, hidden.lost
	}
	return sent, lost
}

// Answering records whether peer answered the last round of link probes.
// A peer that answers none is down for new flows (PeerDown) before its
// connection times out: within a probe round of its death.
func (e *Endpoint) Answering(peer string, ok bool) {
	if ok {
		e.silent.Delete(peer)
	} else {
		e.silent.Store(peer, true)
	}
}

// PeerDown reports whether peer is known unreachable now: it answered no
// probe of the last round, or its connection timed out or a dial failed
// and none is up since.
//
// A peer of replicas (a sidecar RelayNode) is down only once every
// replica's link is: a probe round reaches one replica, so its silence
// says nothing of the others.
func (e *Endpoint) PeerDown(peer string) bool {
	l, replicas := e.controlLinks(peer)
	if l == nil && len(replicas) > 0 {
		for _, r := range replicas {
			if !r.Down() {
				return false
			}
		}
		return true
	}
	if _, silent := e.silent.Load(peer); silent {
		return true
	}
	return l != nil && l.Down()
}

// controlLinks is peer's control link, or (a peer of replicas) the control
// links of its replicas, in replica order.
func (e *Endpoint) controlLinks(peer string) (*Link, []*Link) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l := e.links[linkKey{peer, Control, ""}]; l != nil {
		return l, nil
	}
	var replicas []*Link
	for k, r := range e.links {
		if k.peer == peer && k.class == Control && k.replica != "" {
			replicas = append(replicas, r)
		}
	}
	slices.SortFunc(replicas, func(a, b *Link) int { return strings.Compare(a.replica, b.replica) })
	return nil, replicas
}

func (e *Endpoint) Live(peer string) *Conn {
	l, replicas := e.controlLinks(peer)
	if l != nil {
		return l.Live()
	}
	for _, r := range replicas {
		if c := r.Live(); c != nil {
			return c
		}
	}
	return nil
}

// Close ends every connection and stops the endpoint.
func (e *Endpoint) Close() error {
	e.cancel()
	err := e.ln.Close()
	e.mu.Lock()
	conns := make([]*Conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.CloseWithError(0, "relay shutting down")
	}
	e.wg.Wait()
	err = errors.Join(err, e.tr.Close())
	if e.dialTr != e.tr {
		err = errors.Join(err, e.dialTr.Close(), e.dialUDP.Close())
	}
	return errors.Join(err, e.udp.Close())
}
