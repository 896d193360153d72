package quic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/relay/eyeballs"
)

// Redial backoff: quick at first so a restarted peer is back within a
// fraction of a second, capped so a dead one costs little.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
	// A connection that lived this long resets the backoff.
	stableAfter = 10 * time.Second
)

// idleLink is how long a class link stays up with no stream opened or
// written on it and no data moving (beyond keepalives, under idleBytes per
// check): a half-closed flow that still receives keeps its link.
var idleLink = 2 * time.Minute

const idleBytes = 16 << 10

// Link keeps one connection to a peer up: it dials the peer's endpoints in
// order, waits for the connection to end, and dials again with backoff. A
// class link (one Tunnel's) ends once it has carried no stream for idleLink.
type Link struct {
	e     *Endpoint
	peer  string
	class string
	addrs []string
	// replica names the one replica this link reaches (its pod, or its
	// address), for a peer with replicas; retired is set when that
	// replica left.
	replica string
	retired atomic.Bool

	open     atomic.Int64 // streams opened on it and not yet done
	lastUsed atomic.Int64 // unix nanos

	done chan struct{} // closed when the link stops for good

	mu   sync.Mutex
	conn *Conn
	up   chan struct{} // closed while conn is set
	// down is closed while the peer is known unreachable: its connection
	// timed out (it stopped answering) or went away after it said it
	// drains, or a dial failed; until a connection is up again. New flows
	// fail at once then, rather than wait out their setup time.
	down chan struct{}
}

// errLinkGone is a class link that closed for being idle while a flow was
// taking it.
var errLinkGone = errors.New("link closed")

func newLink(e *Endpoint, peer, class string, addrs []string) *Link {
	l := &Link{e: e, peer: peer, class: class, addrs: addrs, up: make(chan struct{}), down: make(chan struct{}), done: make(chan struct{})}
	l.lastUsed.Store(time.Now().UnixNano())
	return l
}

// OpenStream opens a stream for a flow on the link's connection (waiting
// for one until ctx ends); the link counts it until the stream is done.
func (l *Link) OpenStream(ctx context.Context) (*Conn, *quicgo.Stream, error) {
	l.lastUsed.Store(time.Now().UnixNano())
	c, err := l.Conn(ctx)
	if errors.Is(err, errLinkGone) {
		return l.e.links.Link(l.peer, l.class, l.addrsNow()).OpenStream(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	s, err := c.OpenFlow(ctx)
	if err != nil {
		return c, nil, err
	}
	l.open.Add(1)
	context.AfterFunc(s.Context(), func() {
		l.lastUsed.Store(time.Now().UnixNano())
		l.open.Add(-1)
	})
	return c, s, nil
}

// idle says whether a class link has carried nothing for idleLink; moved
// is what its connection sent and received since the last check.
func (l *Link) idle(moved uint64) bool {
	if moved > idleBytes {
		l.lastUsed.Store(time.Now().UnixNano())
	}
	return l.class != Control && l.open.Load() == 0 && time.Since(time.Unix(0, l.lastUsed.Load())) > idleLink
}

// SetAddrs replaces the peer's endpoints; the next dial uses them. A live
// connection stays up.
func (l *Link) SetAddrs(addrs []string) {
	l.mu.Lock()
	l.addrs = slices.Clone(addrs)
	l.mu.Unlock()
}

// ErrPeerDown is returned when a peer could not be reached in time.
var ErrPeerDown = errors.New("peer relay unreachable")

// Live returns the connection if it is up now, without waiting.
func (l *Link) Live() *Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil && l.conn.Context().Err() == nil {
		return l.conn
	}
	return nil
}

// Down reports whether the peer is known unreachable now (see Link.down).
func (l *Link) Down() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.down:
		return true
	default:
		return false
	}
}

// markDown records that the peer is unreachable until the next connection.
func (l *Link) markDown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.down:
	default:
		close(l.down)
	}
}

// downCheck is how often a flow waiting for a link's connection looks
// whether its peer became known unreachable meanwhile.
const downCheck = 100 * time.Millisecond

// Conn returns the live connection, waiting for one until ctx ends; it
// fails at once while the peer is known unreachable.
func (l *Link) Conn(ctx context.Context) (*Conn, error) {
	var check <-chan time.Time
	for {
		l.mu.Lock()
		c, up, down := l.conn, l.up, l.down
		l.mu.Unlock()
		if c != nil && c.Context().Err() == nil {
			return c, nil
		}
		if l.e.links.PeerDown(l.peer) {
			return nil, fmt.Errorf("%w: %s does not answer", ErrPeerDown, l.peer)
		}
		if check == nil {
			t := time.NewTicker(downCheck)
			defer t.Stop()
			check = t.C
		}
		select {
		case <-up:
		case <-check:
		case <-down:
			return nil, fmt.Errorf("%w: %s does not answer", ErrPeerDown, l.peer)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %v", ErrPeerDown, l.peer, context.Cause(ctx))
		case <-l.e.ctx.Done():
			return nil, fmt.Errorf("%w: %s: relay shutting down", ErrPeerDown, l.peer)
		case <-l.done:
			return nil, errLinkGone
		}
	}
}

func (l *Link) addrsNow() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addrs
}

func (l *Link) run() {
	defer close(l.done)
	m, relay, log := l.e.opts.Metrics, l.e.opts.Name, l.e.opts.Log.With("peer", l.peer)
	if l.class != Control {
		log = log.With("tunnel", l.class)
		defer l.e.links.forget(l)
	}
	// peer_up follows the control link; class links come and go with use,
	// and replicas with their pods.
	up := m.PeerUp.WithLabelValues(relay, l.peer)
	if l.class != Control || l.replica != "" {
		up = nil
	}
	if l.replica != "" {
		log = log.With("replica", l.replica)
		if l.class == Control {
			defer l.e.links.forget(l)
		}
	}
	// The family series follows peer_up: the connection's, while it is up.
	var family string
	setUp := func(v float64) {
		if up == nil {
			return
		}
		up.Set(v)
		if family != "" {
			m.PeerFamily.DeleteLabelValues(relay, l.peer, family)
		}
		family = ""
		if c := l.Live(); v == 1 && c != nil {
			if family = eyeballs.FamilyOf(c.RemoteAddr()); family != "" {
				m.PeerFamily.WithLabelValues(relay, l.peer, family).Set(1)
			}
		}
	}
	setUp(0)
	backoff := minBackoff
	for l.e.ctx.Err() == nil && !l.retired.Load() {
		c, err := l.dial()
		if err != nil {
			if l.e.ctx.Err() != nil {
				return
			}
			l.e.handshake("dial", "failed")
			l.markDown()
			log.Warn("cannot reach peer", "err", err, "retry_in", backoff)
			wait := backoff/2 + rand.N(backoff/2+1)
			select {
			case <-time.After(wait):
			case <-l.e.ctx.Done():
				return
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		l.e.handshake("dial", "ok")
		if l.class == Control {
			log.Info("peer connected", "remote", c.RemoteAddr())
		} else {
			log.Debug("tunnel link connected", "remote", c.RemoteAddr())
		}
		l.e.wg.Add(1)
		go func() {
			defer l.e.wg.Done()
			c.runDatagrams(l.e)
		}()
		l.mu.Lock()
		l.conn = c
		close(l.up)
		select {
		case <-l.down:
			l.down = make(chan struct{})
		default:
		}
		l.mu.Unlock()
		if l.class == Control && l.replica == "" {
			l.e.links.silent.Delete(l.peer) // a new connection: probes will tell
		}
		setUp(1)
		l.e.links.replicaState(l, true)
		start := time.Now()
		idle, forgotten := false, false
		var lastBytes uint64
		var tick <-chan time.Time
		var ticker *time.Ticker
		switch {
		case l.replica != "": // a retired replica's link closes within a second of its last flow
			ticker = time.NewTicker(time.Second)
			tick = ticker.C
		case l.class != Control:
			ticker = time.NewTicker(idleLink / 4)
			tick = ticker.C
		}
	wait:
		for {
			select {
			case <-c.Context().Done():
				break wait
			case <-l.e.ctx.Done():
				c.CloseWithError(0, "relay shutting down")
				break wait
			case <-tick:
				st := c.ConnectionStats()
				total := st.BytesSent + st.BytesReceived
				moved := total - lastBytes
				lastBytes = total
				if !forgotten && (l.retired.Load() || l.idle(moved)) {
					// New flows get a new link from now on; a flow that
					// took this one a moment ago gets a second to open.
					l.e.links.forget(l)
					forgotten = true
					select {
					case <-time.After(time.Second):
					case <-l.e.ctx.Done():
					}
				}
				if forgotten && l.open.Load() == 0 {
					idle = true
					c.CloseWithError(0, "idle")
					break wait
				}
			}
		}
		if ticker != nil {
			ticker.Stop()
		}
		l.mu.Lock()
		l.conn = nil
		l.up = make(chan struct{})
		l.mu.Unlock()
		setUp(0)
		if l.e.ctx.Err() != nil || idle || l.retired.Load() {
			return
		}
		l.e.links.replicaState(l, false)
		var timedOut *quicgo.IdleTimeoutError
		if errors.As(context.Cause(c.Context()), &timedOut) || c.Draining() {
			// It stopped answering, or left after its drain: it will
			// not take a flow until a new connection says otherwise.
			l.markDown()
		}
		if timedOut != nil && l.class == Control && l.replica == "" {
			l.e.event(Event{Kind: PeerLost, Peer: l.peer})
		}
		if c.Draining() || l.e.draining.Load() {
			log.Info("peer connection ended after a drain", "err", context.Cause(c.Context()))
		} else {
			log.Warn("peer connection lost", "err", context.Cause(c.Context()))
		}
		if l.e.draining.Load() {
			// This relay drains: it takes no new flow, and its open ones
			// rode the connection that ended, so a new one would carry
			// nothing. Redialing only logged "peer connected" lines after
			// the drain's last words (every relay of hoplink local at
			// Ctrl-C).
			return
		}
		if time.Since(start) > stableAfter {
			backoff = minBackoff
		}
	}
}

// dial connects to one of the peer's endpoints. Where they hold both IP
// families it races them (package eyeballs): a family that is dead on the
// path costs a quarter of a second, not a handshake timeout per address.
func (l *Link) dial() (*Conn, error) {
	l.mu.Lock()
	addrs := l.addrs
	l.mu.Unlock()
	if len(addrs) == 0 {
		return nil, fmt.Errorf("relay %q has no endpoints", l.peer)
	}
	resolved, rerr := eyeballs.Resolve(l.e.ctx, net.DefaultResolver, addrs)
	// A socket bound to one address sends to its own family only.
	local := l.e.dialUDP.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
	var usable []netip.AddrPort
	var errs []error
	for _, a := range eyeballs.Order(resolved) {
		if eyeballs.Reachable(local, a.Addr()) {
			usable = append(usable, a)
		} else {
			errs = append(errs, fmt.Errorf("%s: not reachable from the relay's socket on %s", a, local))
		}
	}
	qc, _, err := eyeballs.Race(l.e.ctx, usable, eyeballs.Delay, func(ctx context.Context, a netip.AddrPort) (*quicgo.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		defer cancel()
		qc, err := l.e.dialTr.Dial(ctx, net.UDPAddrFromAddrPort(a), l.e.opts.Identity.ClientConfig(l.peer), dialConfig())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a, unanswered(err))
		}
		return qc, nil
	}, func(qc *quicgo.Conn) { qc.CloseWithError(0, "another address answered first") })
	if err == nil {
		return newConn(qc, l.peer, true), nil
	}
	if !errors.Is(err, eyeballs.ErrNoAddress) {
		errs = append(errs, err)
	}
	return nil, errors.Join(append([]error{rerr}, errs...)...)
}

// errUnanswered is a handshake nothing answered: the dial's deadline and
// QUIC's handshake idle timeout are the same 5 s, and which one ends it
// first is the scheduler's choice, not news for the reader of the log.
var errUnanswered = fmt.Errorf("no answer to the QUIC handshake within %v", handshakeTimeout)

func unanswered(err error) error {
	var idle *quicgo.IdleTimeoutError
	var hs *quicgo.HandshakeTimeoutError
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &idle) || errors.As(err, &hs) {
		return errUnanswered
	}
	return err
}
