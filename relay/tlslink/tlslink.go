// Package tlslink carries TCP flows between relays over TLS 1.3 on TCP, one
// connection per flow. It exists for bulk transfer on clean links: there the
// kernel's TCP offloads move 64 KiB segments where QUIC moves 1.4 KB UDP
// packets, one system call path each. So that a flow still costs no
// handshake, every peer has a pool of connections handshaken in advance.
// Authentication is the same as QUIC's: the CA, and a relay name that the
// manifests know.
package tlslink

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/ratelog"
)

const (
	handshakeTimeout = 5 * time.Second
	// A spare lives at most this long in a pool; the listener waits a
	// little longer than that for a connection's header.
	spareMaxAge   = 30 * time.Second
	headerTimeout = spareMaxAge + 15*time.Second
	// DefaultSpares is how many handshaken connections a pool keeps ready.
	DefaultSpares = 8
	// refillParallel bounds concurrent handshakes of one pool refilling.
	refillParallel = 4
	// MaxHandshakes bounds the handshakes a listener runs at once: before
	// a client has proved who it is, it must not cost the relay without
	// bound. Past it, new connections are closed at once (and counted as
	// failed accepts), while peers with a handshake done are served.
	MaxHandshakes = 128
	// MaxHandshakesPerSource bounds those from one host: a relay's pools
	// to this peer dial at most poolDials at once, and several relays may
	// share a host.
	MaxHandshakesPerSource = 64
	poolDials              = 16
	minBackoff             = 100 * time.Millisecond
	maxBackoff             = 5 * time.Second
)

const (
	// MaxWaitingPerPeer and MaxWaiting bound the connections, of one peer
	// and in all, that are handshaken and have not yet started a flow.
	// Pools keep spares so, idle for up to spareMaxAge: DefaultSpares per
	// pool, a pool per replica of a peer, so a peer's share leaves room for
	// 32 replicas. Past a bound the oldest waiting connection of the peer
	// (or, past MaxWaiting, of the peer that holds the most) is closed
	// rather than the new one refused: a new spare is the one its pool
	// holds and will hand out next, the oldest is nearest retirement or
	// already forgotten (a peer gone without a FIN), and a peer that floods
	// the listener only recycles its own connections, never another's.
	MaxWaitingPerPeer = 256
	MaxWaiting        = 1024
)

// Options configure an Endpoint.
type Options struct {
	Name     string
	Identity *pki.Identity
	// Listen is the TCP host:port; relays use their QUIC port number.
	Listen    string
	KnownPeer func(name string) bool
	// Congestion is the TCP congestion control of the links this endpoint
	// dials and accepts (ChooseCongestion).
	Congestion Congestion
	// Handler serves an authenticated connection whose read deadline bounds
	// the wait for the flow's header, and calls Endpoint.Started once it
	// has read the header: until then the connection may be closed to make
	// room for others (MaxWaitingPerPeer). It owns the connection.
	Handler func(peer string, c *tls.Conn)
	// Admin, when set, serves the admin API to the operator: connections
	// that negotiate pki.AdminALPN with the operator's certificate.
	Admin  http.Handler
	Spares int
	// OnRejected is told of every peer handshake refused.
	OnRejected func(remote net.Addr, err error)
	Metrics    *metrics.Metrics
	Log        *slog.Logger
}

// Endpoint accepts and dials TLS links for one relay.
type Endpoint struct {
	opts   Options
	warn   *ratelog.Logger // for what peers can make the relay log
	ln     net.Listener
	admin  *http.Server
	adminL *connListener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// serverConf is the listener's TLS config; its session ticket keys
	// change when the CAs do, so no session of the old trust resumes.
	serverConf *tls.Config
	cc         ccSetting // the links' congestion control

	mu          sync.Mutex
	trusted     *x509.CertPool // the CAs the pools and tickets were made under
	pools       map[string]*Pool
	active      map[*tls.Conn]struct{} // connections carrying flows, closed by Close
	shaking     int                    // handshakes in progress
	shakingFrom map[string]int         // ... by source host
	// waiting holds the connections of each peer that have not started a
	// flow yet, oldest first (spares, and headers on their way).
	waiting    map[string][]*tls.Conn
	waitingFor map[*tls.Conn]string // ... and whose they are
	// waitMax and waitPerPeer are MaxWaiting and MaxWaitingPerPeer
	// (tests take less).
	waitMax, waitPerPeer int
}

// Listen binds the TCP listener and starts accepting peers.
func Listen(opts Options) (*Endpoint, error) {
	if opts.Spares <= 0 {
		opts.Spares = DefaultSpares
	}
	e := &Endpoint{opts: opts, warn: ratelog.New(opts.Log), pools: map[string]*Pool{}, active: map[*tls.Conn]struct{}{},
		shakingFrom: map[string]int{}, waiting: map[string][]*tls.Conn{}, waitingFor: map[*tls.Conn]string{},
		waitMax: MaxWaiting, waitPerPeer: MaxWaitingPerPeer}
	e.cc.store(opts.Congestion)
	lc := net.ListenConfig{Control: e.control}
	ln, err := lc.Listen(context.Background(), "tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay TLS listen: %w", err)
	}
	e.ln = ln
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if opts.Admin != nil {
		e.adminL = &connListener{addr: ln.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
		e.admin = &http.Server{Handler: opts.Admin, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
			// The handler admits each call by the name the client proved.
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				if ac, ok := c.(adminConn); ok {
					return adminapi.WithClient(ctx, ac.client)
				}
				return ctx
			}}
		go e.admin.Serve(e.adminL)
	}
	protos := []string{pki.ALPN}
	if e.opts.Admin != nil {
		protos = append(protos, pki.AdminALPN)
	}
	e.trusted = opts.Identity.Roots()
	e.serverConf = e.opts.Identity.ServerConfig(func(remote net.Addr, err error) {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected peer certificate", "transport", "tls", "remote", remote, "err", err)
		e.rejected(remote, err)
	}, protos...)
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// connListener hands the admin server the connections that chose its
// protocol on the relay's TLS port.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// serveAdmin passes a connection to the admin server if the operator holds
// it; anyone else with a certificate of the CA is turned away.
func (e *Endpoint) serveAdmin(c *tls.Conn) {
	peer, err := pki.PeerName(c.ConnectionState())
	if err == nil && (e.admin == nil || !pki.AdminClient(peer)) {
		err = fmt.Errorf("%q may not use the admin API", peer)
	}
	if err != nil {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected admin client", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	e.handshake("accept", "ok")
	select {
	// Wrapped, because net/http closes a *tls.Conn whose protocol (ours)
	// it has no TLSNextProto handler for; as a plain conn it speaks HTTP/1.1.
	case e.adminL.conns <- adminConn{Conn: c, client: peer}:
	case <-e.adminL.done:
		c.Close()
	}
}

type adminConn struct {
	net.Conn
	client string
}

// Addr is the bound TCP address.
func (e *Endpoint) Addr() net.Addr { return e.ln.Addr() }

func (e *Endpoint) handshake(direction, result string) {
	e.opts.Metrics.Handshakes.WithLabelValues(e.opts.Name, direction, result).Inc()
}

func (e *Endpoint) accept() {
	defer e.wg.Done()
	conf := e.serverConf
	for {
		raw, err := e.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors: slow down
			continue
		}
		src := sourceOf(raw.RemoteAddr())
		if !e.startHandshake(src) {
			e.handshake("accept", "failed")
			raw.Close()
			continue
		}
		go func() {
			// The slot is given back once the handshake ends (or, should
			// serve panic, at the latest here).
			defer func() { e.endHandshake(src) }()
			e.serve(tls.Server(wrap(raw), conf), func() { e.endHandshake(src); src = "" })
		}()
	}
}

// sourceOf is the host a connection comes from.
func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return a.String()
}

// startHandshake takes a handshake slot for a connection from src: at most
// MaxHandshakes at once, and MaxHandshakesPerSource from one host, so that
// one host cannot take every slot.
func (e *Endpoint) startHandshake(src string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shaking >= MaxHandshakes || e.shakingFrom[src] >= MaxHandshakesPerSource {
		return false
	}
	e.shaking++
	e.shakingFrom[src]++
	return true
}

// endHandshake gives a slot back; "" is a slot already given back.
func (e *Endpoint) endHandshake(src string) {
	if src == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shaking--
	if e.shakingFrom[src]--; e.shakingFrom[src] <= 0 {
		delete(e.shakingFrom, src)
	}
}

func (e *Endpoint) serve(c *tls.Conn, handshaken func()) {
	ctx, cancel := context.WithTimeout(e.ctx, handshakeTimeout)
	err := c.HandshakeContext(ctx)
	cancel()
	handshaken()
	if err != nil {
		c.Close() // a bad certificate was counted by the TLS config
		return
	}
	if c.ConnectionState().NegotiatedProtocol == pki.AdminALPN {
		e.serveAdmin(c)
		return
	}
	peer, err := pki.PeerName(c.ConnectionState())
	if err == nil && !e.opts.KnownPeer(peer) {
		err = fmt.Errorf("relay %q is in no manifest this relay knows", peer)
	}
	if err != nil {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected peer", "transport", "tls", "remote", c.RemoteAddr(), "err", err)
		e.rejected(c.RemoteAddr(), err)
		c.Close()
		return
	}
	e.handshake("accept", "ok")
	if !e.track(c) {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	if old, whose := e.wait(peer, c); old != nil {
		e.opts.Metrics.Rejected.WithLabelValues(e.opts.Name, "header_limit").Inc()
		e.warn.Warn("closed the oldest connection waiting for its header: too many wait", "transport", "tls",
			"peer", whose, "remote", old.RemoteAddr())
		old.NetConn().Close() // its handler sees the error and ends
	}
	defer e.Started(c) // at the latest
	e.opts.Handler(peer, c)
}

// wait counts c among the connections of peer that wait for their flow
// to start, and returns the one to close to make room, if any, with its
// peer: the oldest of peer past its share, else past the total the oldest
// of the peer that holds the most (peer itself on a tie).
func (e *Endpoint) wait(peer string, c *tls.Conn) (old *tls.Conn, whose string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case len(e.waiting[peer]) >= e.waitPerPeer:
		whose = peer
	case len(e.waitingFor) >= e.waitMax:
		whose = peer
		for p, cs := range e.waiting {
			if len(cs) > len(e.waiting[whose]) {
				whose = p
			}
		}
	}
	if cs := e.waiting[whose]; whose != "" && len(cs) > 0 {
		old = cs[0]
		e.unwaitLocked(old)
	}
	e.waiting[peer] = append(e.waiting[peer], c)
	e.waitingFor[c] = peer
	return old, whose
}

// Started tells the endpoint that c's flow has started (its header was
// read): it no longer counts as waiting, and is never closed to make room
// for others. The handler calls it; serve does once the handler returns.
func (e *Endpoint) Started(c *tls.Conn) {
	e.mu.Lock()
	e.unwaitLocked(c)
	e.mu.Unlock()
}

func (e *Endpoint) unwaitLocked(c *tls.Conn) {
	peer, ok := e.waitingFor[c]
	if !ok {
		return
	}
	delete(e.waitingFor, c)
	cs := slices.DeleteFunc(e.waiting[peer], func(x *tls.Conn) bool { return x == c })
	if len(cs) == 0 {
		delete(e.waiting, peer)
		return
	}
	e.waiting[peer] = cs
}

func (e *Endpoint) track(c *tls.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return false
	}
	e.active[c] = struct{}{}
	return true
}

func (e *Endpoint) rejected(remote net.Addr, err error) {
	if e.opts.OnRejected != nil {
		e.opts.OnRejected(remote, err)
	}
}

// Recheck closes every connection carrying a flow whose peer no longer
// holds: its certificate expired, or (full) the manifests no longer name
// it. With full, new handshakes also check peers against the CAs trusted
// now (no session made before resumes). It returns how many it closed.
func (e *Endpoint) Recheck(full bool) int {
	e.mu.Lock()
	conns := make([]*tls.Conn, 0, len(e.active))
	for c := range e.active {
		conns = append(conns, c)
	}
	var pools []*Pool
	retrust := full && e.trusted != e.opts.Identity.Roots()
	if retrust {
		e.trusted = e.opts.Identity.Roots()
		for _, p := range e.pools {
			pools = append(pools, p)
		}
	}
	e.mu.Unlock()
	if retrust {
		// Sessions resume without a certificate check: none made under
		// the old trust may.
		var key [32]byte
		crand.Read(key[:])
		e.serverConf.SetSessionTicketKeys([][32]byte{key})
		for _, p := range pools {
			p.retrust()
			p.drain() // spares were checked under the old trust
			p.refill()
		}
	}
	n := 0
	for _, c := range conns {
		if err := e.peerHolds(c.ConnectionState(), full); err != nil {
			peer, _ := pki.PeerName(c.ConnectionState())
			e.opts.Log.Warn("closing the connection to a peer that no longer holds", "peer", peer, "transport", "tls", "err", err)
			c.NetConn().Close()
			n++
		}
	}
	return n
}

// ClosePeer closes every connection carrying a flow to or from peer, and
// returns how many: the peer stopped answering, and TCP would keep its
// flows hanging for as long as its kernel still acknowledges (a stopped
// process) or its retransmissions last (a lost host).
func (e *Endpoint) ClosePeer(peer string) int {
	e.mu.Lock()
	var conns []*tls.Conn
	for c := range e.active {
		if name, err := pki.PeerName(c.ConnectionState()); err == nil && name == peer {
			conns = append(conns, c)
		}
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.NetConn().Close()
	}
	return len(conns)
}

func (e *Endpoint) peerHolds(st tls.ConnectionState, full bool) error {
	if len(st.PeerCertificates) == 0 {
		return nil // not yet handshaken
	}
	if leaf := st.PeerCertificates[0]; time.Now().After(leaf.NotAfter) {
		return fmt.Errorf("its certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if !full {
		return nil
	}
	if peer, err := pki.PeerName(st); err != nil || (e.opts.KnownPeer != nil && !e.opts.KnownPeer(peer)) {
		return errors.New("the manifests no longer name it")
	}
	return nil
}

// Done tells the endpoint a connection's flow has ended and it is closed.
func (e *Endpoint) Done(c *tls.Conn) {
	e.mu.Lock()
	delete(e.active, c)
	e.unwaitLocked(c)
	e.mu.Unlock()
}

// Pool returns the pool of connections to a peer, creating it (and starting
// to fill it) on first use.
func (e *Endpoint) Pool(peer string, addrs []string) *Pool {
	return e.pool(peer, peer, addrs)
}

// Replica returns the pool of connections to one replica of a peer whose
// relays are replicas of one name (a sidecar RelayNode), so flows spread
// over them as they do over QUIC.
func (e *Endpoint) Replica(peer, addr string) *Pool {
	return e.pool(peer+" "+addr, peer, []string{addr})
}

// Retire stops the replica pools of peer whose address is not in keep
// (the replica left); flows that already took a connection keep it.
func (e *Endpoint) Retire(peer string, keep []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, p := range e.pools {
		if addr, ok := strings.CutPrefix(k, peer+" "); ok && !slices.Contains(keep, addr) {
			delete(e.pools, k)
			close(p.stop)
		}
	}
}

func (e *Endpoint) pool(key, peer string, addrs []string) *Pool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.pools[key]; p != nil {
		p.mu.Lock()
		p.addrs = addrs // endpoints may change while the relay runs
		p.mu.Unlock()
		return p
	}
	p := &Pool{e: e, peer: peer, addrs: addrs, wake: make(chan struct{}, 1), stop: make(chan struct{}), dialing: make(chan struct{}, poolDials)}
	p.retrust()
	e.pools[key] = p
	if e.ctx.Err() == nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			p.fill()
		}()
	}
	return p
}

// Close stops accepting, closes every spare and waits for the pools.
func (e *Endpoint) Close() error {
	e.cancel()
	err := e.ln.Close()
	if e.admin != nil {
		e.adminL.Close()
		e.admin.Close()
	}
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.pools {
		p.drain()
	}
	for c := range e.active {
		c.NetConn().Close() // ends the flow; its relay goroutines see the error
	}
	return err
}

// Pool keeps handshaken connections to one peer ready for new flows.
type Pool struct {
	e     *Endpoint
	peer  string
	addrs []string
	wake  chan struct{}
	stop  chan struct{} // closed when a replica's pool is retired
	// conf resumes TLS 1.3 sessions: a refill then skips certificate
	// signatures and verification, the costly part of a handshake. The
	// peer's identity is bound to the ticket it issued after a full,
	// verified handshake.
	conf atomic.Pointer[tls.Config]
	// dialing bounds this pool's handshakes in progress, so that a burst
	// of new flows stays within what the peer's listener lets one host
	// run (MaxHandshakesPerSource).
	dialing chan struct{}

	mu     sync.Mutex
	spares []spare
}

// retrust makes the pool's dials check the peer against the CAs trusted
// now, with a session cache of their own: a session made under the old
// trust does not resume.
func (p *Pool) retrust() {
	conf := p.e.opts.Identity.ClientConfig(p.peer)
	conf.ClientSessionCache = tls.NewLRUClientSessionCache(64)
	p.conf.Store(conf)
}

type spare struct {
	c    *tls.Conn
	born time.Time
}

// Get returns a connection for one flow: a spare when one is ready and
// alive, else a new one dialed now.
func (p *Pool) Get(ctx context.Context) (*tls.Conn, error) {
	if c := p.Spare(); c != nil {
		return c, nil
	}
	defer p.refill()
	select {
	case p.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	c, err := p.dial(ctx)
	<-p.dialing
	if err == nil && !p.e.track(c) {
		c.Close()
		return nil, errors.New("relay shutting down")
	}
	return c, err
}

// Spare returns a ready connection for one flow, or nil when none is:
// a flow that would rather take another transport than wait for a
// handshake.
func (p *Pool) Spare() *tls.Conn {
	defer p.refill()
	for {
		p.mu.Lock()
		n := len(p.spares)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		s := p.spares[n-1]
		p.spares = p.spares[:n-1]
		p.mu.Unlock()
		if time.Since(s.born) < spareMaxAge && alive(s.c) && p.e.peerHolds(s.c.ConnectionState(), false) == nil && p.e.track(s.c) {
			return s.c
		}
		s.c.Close()
	}
}

// Spares is how many connections are ready.
func (p *Pool) Spares() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.spares)
}

func (p *Pool) refill() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its size, replaces spares before they age out,
// and backs off while the peer cannot be reached.
func (p *Pool) fill() {
	backoff := minBackoff
	for {
		p.mu.Lock()
		now := time.Now()
		kept := p.spares[:0]
		for _, s := range p.spares {
			if now.Sub(s.born) < spareMaxAge-5*time.Second {
				kept = append(kept, s)
			} else {
				s.c.Close()
			}
		}
		p.spares = kept
		missing := p.e.opts.Spares - len(p.spares)
		p.mu.Unlock()
		if missing > 0 {
			if err := p.add(min(missing, refillParallel)); err != nil {
				if p.e.ctx.Err() != nil {
					return
				}
				p.e.opts.Log.Warn("cannot reach peer", "transport", "tls", "peer", p.peer, "err", err, "retry_in", backoff)
				select {
				case <-time.After(backoff/2 + rand.N(backoff/2+1)):
				case <-p.e.ctx.Done():
					return
				case <-p.stop:
					p.drain()
					return
				}
				backoff = min(2*backoff, maxBackoff)
			} else {
				backoff = minBackoff
			}
			continue
		}
		select {
		case <-p.wake:
		case <-time.After(5 * time.Second):
		case <-p.e.ctx.Done():
			return
		case <-p.stop:
			p.drain()
			return
		}
	}
}

// add dials n spares at once; it fails only if none could be made.
func (p *Pool) add(n int) error {
	errs := make(chan error, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(p.e.ctx, handshakeTimeout)
			defer cancel()
			c, err := p.dial(ctx)
			if err == nil {
				p.mu.Lock()
				p.spares = append(p.spares, spare{c: c, born: time.Now()})
				p.mu.Unlock()
			}
			errs <- err
		}()
	}
	var failed []error
	for range n {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) == n {
		return errors.Join(failed...)
	}
	return nil
}

func (p *Pool) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.spares {
		s.c.Close()
	}
	p.spares = nil
}

func (p *Pool) dial(ctx context.Context) (*tls.Conn, error) {
	var errs []error
	p.mu.Lock()
	addrs := p.addrs
	p.mu.Unlock()
	for _, a := range addrs {
		d := net.Dialer{Control: p.e.control}
		raw, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c := tls.Client(wrap(raw), p.conf.Load())
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			p.e.handshake("dial", "failed")
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		p.e.handshake("dial", "ok")
		return c, nil
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("relay %q has no endpoints", p.peer)
	}
	return nil, errors.Join(errs...)
}

// alive reports whether a spare's socket has no EOF and no error pending, as
// a peer that restarted or closed it would show. Pending data is fine: TLS
// 1.3 servers send session tickets after the handshake, and crypto/tls
// reads them with the flow's first read.
func alive(c *tls.Conn) bool {
	tc := TCP(c.NetConn())
	if tc == nil {
		return true
	}
	ok := false
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		// Unread bytes (a session ticket the peer sent after the
		// handshake) hide a FIN behind them: ask TCP whether the peer
		// closed too.
		ok = err == unix.EAGAIN || (err == nil && n > 0 && !peerClosed(fd))
		return true
	})
	return ok
}
