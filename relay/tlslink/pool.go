package tlslink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/errlist"
	"github.com/hoplink/hoplink/relay/eyeballs"
	"github.com/hoplink/hoplink/srcaddr"
)

// Pools are the pools of connections an endpoint dials, one per peer (or
// replica of one).
type Pools struct {
	e *Endpoint

	mu      sync.Mutex
	pools   map[string]*Pool
	trusted *x509.CertPool // the CAs the pools were made under

	// extra is how many spares all pools hold above their base
	// (maxAllSpares bounds it).
	extra atomic.Int64
}

// Pool returns the pool of connections to a peer, creating it (and starting
// to fill it) on first use.
func (ps *Pools) Pool(peer string, addrs []string) *Pool {
	return ps.pool(peer, peer, addrs)
}

// Replica returns the pool of connections to one replica of a peer whose
// relays are replicas of one name (a sidecar RelayNode), so flows spread
// over them as they do over QUIC: the replica named replica, dialed at
// addrs (every address of its pod).
func (ps *Pools) Replica(peer, replica string, addrs []string) *Pool {
	return ps.pool(peer+" "+replica, peer, addrs)
}

// Retire stops the replica pools of peer whose replica is not in keep
// (the replica left); flows that already took a connection keep it.
func (ps *Pools) Retire(peer string, keep []string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, p := range ps.pools {
		if replica, ok := strings.CutPrefix(k, peer+" "); ok && !slices.Contains(keep, replica) {
			delete(ps.pools, k)
			close(p.stop)
		}
	}
}

func (ps *Pools) pool(key, peer string, addrs []string) *Pool {
	e := ps.e
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.pools[key]; p != nil {
		p.mu.Lock()
		p.addrs = addrs // endpoints may change while the relay runs
		p.mu.Unlock()
		return p
	}
	p := &Pool{e: e, peer: peer, addrs: addrs, wake: make(chan struct{}, 1), stop: make(chan struct{}), dialing: make(chan struct{}, poolDials)}
	p.retrust()
	ps.pools[key] = p
	if e.ctx.Err() == nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			p.fill()
		}()
	}
	return p
}

// of is how many pools dial peer: one, or one per replica.
func (ps *Pools) of(peer string) int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := 0
	for _, p := range ps.pools {
		if p.peer == peer {
			n++
		}
	}
	return max(n, 1)
}

// retrust makes every pool check its peer against the CAs trusted now,
// if they changed since the pools were made: their spares, checked under
// the old trust, go, and sessions made under it stop resuming. It says
// whether they changed.
func (ps *Pools) retrust() bool {
	roots := ps.e.opts.Identity.Roots()
	ps.mu.Lock()
	if ps.trusted == roots {
		ps.mu.Unlock()
		return false
	}
	ps.trusted = roots
	pools := make([]*Pool, 0, len(ps.pools))
	for _, p := range ps.pools {
		pools = append(pools, p)
	}
	ps.mu.Unlock()
	for _, p := range pools {
		p.retrust()
		p.drain() // spares were checked under the old trust
		p.refill()
	}
	return true
}

// drain closes every pool's spares.
func (ps *Pools) drain() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.pools {
		p.drain()
	}
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
	extra  int // of spares, above the base (counted)
	demand demand
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
	p.asked()
	if c := p.spare(); c != nil {
		return c, nil
	}
	defer p.refill()
	select {
	case p.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	return p.dialNow(ctx)
}

// Quick returns a spare, or a connection dialed now when one of the pool's
// handshake slots (poolDials) is free, or nil: a flow that would rather
// take another transport than queue behind a burst's handshakes. A dial
// that fails is nil too, within quickDial and half of what ctx leaves, so
// that the other transport, which may still reach the peer, has the rest.
func (p *Pool) Quick(ctx context.Context) *tls.Conn {
	p.asked()
	if c := p.spare(); c != nil {
		return c
	}
	defer p.refill()
	select {
	case p.dialing <- struct{}{}:
	default:
		return nil
	}
	within := quickDial
	if d, ok := ctx.Deadline(); ok {
		within = min(within, time.Until(d)/2)
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	c, _ := p.dialNow(ctx)
	return c
}

// dialNow dials a connection for a flow in a handshake slot taken.
func (p *Pool) dialNow(ctx context.Context) (*tls.Conn, error) {
	c, err := p.dial(ctx)
	<-p.dialing
	if err != nil {
		return nil, err
	}
	if !p.e.track(c) {
		c.Close()
		return nil, errors.New("relay shutting down")
	}
	return c, nil
}

// Spare returns a ready connection for one flow, or nil when none is:
// a flow that would rather take another transport than wait for a
// handshake.
func (p *Pool) Spare() *tls.Conn {
	p.asked()
	return p.spare()
}

func (p *Pool) spare() *tls.Conn {
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
		p.counted()
		p.mu.Unlock()
		if time.Since(s.born) < p.e.spareAge && alive(s.c) && p.e.peerHolds(s.c.ConnectionState(), false) == nil && p.e.track(s.c) {
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

// asked counts a flow that asked for a connection in the pool's demand,
// whether it got one or went without (another transport).
func (p *Pool) asked() {
	p.mu.Lock()
	p.demand.asked(time.Now())
	p.mu.Unlock()
}

func (p *Pool) refill() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its size, renews spares before they age out,
// and backs off while the peer cannot be reached.
//
// A spare is renewed make-before-break: from renewAt of its life it still
// serves while a replacement is dialed, and is closed once the
// replacement is in (or at spareMaxAge). Spares made for a burst are born
// within a second or two of each other, so closing them as they reached
// renewAt emptied the pool at once, and refilling it paced took as long
// again: a burst that came then found no spares.
func (p *Pool) fill() {
	backoff := minBackoff
	for {
		bound := maxSpares / p.e.pools.of(p.peer)
		p.mu.Lock()
		now := time.Now()
		want := p.demand.spares(p.e.opts.Spares, bound, now)
		if want > p.e.opts.Spares {
			// Above its base a pool takes what the others leave of
			// maxAllSpares.
			others := int(p.e.pools.extra.Load()) - p.extra
			want = p.e.opts.Spares + max(0, min(want-p.e.opts.Spares, p.e.maxAllSpares-others))
		}
		fresh, next, late := p.renew(now, want)
		missing := want - fresh
		p.mu.Unlock()
		if missing > 0 {
			n, pace := min(missing, refillParallel), time.Duration(0)
			if fresh >= p.e.opts.Spares && !late {
				n, pace = 1, refillPace // above the base: spread out
			}
			err := p.add(n)
			if err == nil && pace > 0 {
				select {
				case <-time.After(pace):
				case <-p.e.ctx.Done():
					return
				case <-p.stop:
					p.drain()
					return
				}
			}
			if err != nil {
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
		case <-time.After(next):
		case <-p.e.ctx.Done():
			return
		case <-p.stop:
			p.drain()
			return
		}
	}
}

// renew closes the spares at spareMaxAge, and those past renewAt that the
// pool holds beyond want; it returns how many spares are short of
// renewAt, when the next one reaches it (at most idleCheck from now), and
// whether renewing runs late. Spares are in the order they were born.
// Under p.mu.
func (p *Pool) renew(now time.Time, want int) (fresh int, next time.Duration, late bool) {
	maxAge := p.e.spareAge
	renewAt := maxAge - maxAge/renewAhead
	defer p.counted()
	n := len(p.spares)
	// Oldest first: those past their age, then those due for renewal.
	gone := 0
	for gone < n && now.Sub(p.spares[gone].born) >= maxAge {
		gone++
	}
	due := gone
	for due < n && now.Sub(p.spares[due].born) >= renewAt {
		due++
	}
	// What is past its age goes, and the oldest due beyond want.
	drop := gone + max(0, min(due-gone, n-gone-want))
	for _, s := range p.spares[:drop] {
		s.c.Close()
	}
	p.spares = p.spares[:copy(p.spares, p.spares[drop:])]
	clear(p.spares[len(p.spares):n])
	old := due - drop
	next = idleCheck
	if old < len(p.spares) {
		next = min(next, p.spares[old].born.Add(renewAt).Sub(now))
	}
	// Late: the oldest has less than half its renewal time left, so
	// handshakes are slower now than when it was made.
	late = old > 0 && now.Sub(p.spares[0].born) >= renewAt+(maxAge-renewAt)/2
	return len(p.spares) - old, max(next, time.Millisecond), late
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
				// Born under p.mu, so spares stay in the order they
				// were born (renew relies on it).
				p.spares = append(p.spares, spare{c: c, born: time.Now()})
				p.counted()
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
		return errlist.Distinct(failed)
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
	p.counted()
}

// counted tells the pools how many spares p holds above its base, after
// a change. Under p.mu.
func (p *Pool) counted() {
	extra := max(len(p.spares)-p.e.opts.Spares, 0)
	p.e.pools.extra.Add(int64(extra - p.extra))
	p.extra = extra
}

// dial connects and handshakes with one of the peer's endpoints, racing
// them where they hold both IP families (package eyeballs), so a family
// that is dead on the path costs a quarter of a second.
func (p *Pool) dial(ctx context.Context) (*tls.Conn, error) {
	p.mu.Lock()
	addrs := p.addrs
	p.mu.Unlock()
	if len(addrs) == 0 {
		return nil, fmt.Errorf("relay %q has no endpoints", p.peer)
	}
	resolved, rerr := eyeballs.Resolve(ctx, net.DefaultResolver, addrs)
	c, _, err := eyeballs.Race(ctx, eyeballs.Order(resolved), eyeballs.Delay, func(ctx context.Context, a netip.AddrPort) (*tls.Conn, error) {
		d := net.Dialer{Control: p.e.control}
		raw, err := d.DialContext(ctx, "tcp", a.String())
		if err != nil {
			return nil, err
		}
		c := tls.Client(wrap(raw), p.conf.Load())
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			if ctx.Err() == nil { // not an attempt the race called off
				p.e.handshake("dial", "failed")
			}
			return nil, fmt.Errorf("%s: %w", a, err)
		}
		p.e.handshake("dial", "ok")
		// The peer's host: its own dials to this relay likely come from it.
		p.e.handshakes.learn(srcaddr.Of(raw.RemoteAddr()), time.Now())
		return c, nil
	}, func(c *tls.Conn) { c.Close() })
	if err == nil {
		return c, nil
	}
	if errors.Is(err, eyeballs.ErrNoAddress) {
		return nil, rerr
	}
	return nil, errors.Join(rerr, err)
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
