package quic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"
)

// Redial backoff: quick at first so a restarted peer is back within a
// fraction of a second, capped so a dead one costs little.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
	// A connection that lived this long resets the backoff.
	stableAfter = 10 * time.Second
)

// Link keeps one connection to a peer up: it dials the peer's endpoints in
// order, waits for the connection to end, and dials again with backoff.
type Link struct {
	e     *Endpoint
	peer  string
	addrs []string

	mu   sync.Mutex
	conn *Conn
	up   chan struct{} // closed while conn is set
}

func newLink(e *Endpoint, peer string, addrs []string) *Link {
	return &Link{e: e, peer: peer, addrs: addrs, up: make(chan struct{})}
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

// Conn returns the live connection, waiting for one until ctx ends.
func (l *Link) Conn(ctx context.Context) (*Conn, error) {
	for {
		l.mu.Lock()
		c, up := l.conn, l.up
		l.mu.Unlock()
		if c != nil && c.Context().Err() == nil {
			return c, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %v", ErrPeerDown, l.peer, context.Cause(ctx))
		case <-l.e.ctx.Done():
			return nil, fmt.Errorf("%w: %s: relay shutting down", ErrPeerDown, l.peer)
		}
	}
}

func (l *Link) run() {
	m, relay, log := l.e.opts.Metrics, l.e.opts.Name, l.e.opts.Log.With("peer", l.peer)
	up := m.PeerUp.WithLabelValues(relay, l.peer)
	up.Set(0)
	backoff := minBackoff
	for l.e.ctx.Err() == nil {
		c, err := l.dial()
		if err != nil {
			if l.e.ctx.Err() != nil {
				return
			}
			l.e.handshake("dial", "failed")
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
		log.Info("peer connected", "remote", c.RemoteAddr())
		l.e.wg.Add(1)
		go func() {
			defer l.e.wg.Done()
			c.runDatagrams(l.e.dropped, l.e.echo)
		}()
		l.mu.Lock()
		l.conn = c
		close(l.up)
		l.mu.Unlock()
		up.Set(1)
		start := time.Now()
		select {
		case <-c.Context().Done():
		case <-l.e.ctx.Done():
			c.CloseWithError(0, "relay shutting down")
		}
		l.mu.Lock()
		l.conn = nil
		l.up = make(chan struct{})
		l.mu.Unlock()
		up.Set(0)
		if l.e.ctx.Err() != nil {
			return
		}
		log.Warn("peer connection lost", "err", context.Cause(c.Context()))
		if time.Since(start) > stableAfter {
			backoff = minBackoff
		}
	}
}

func (l *Link) dial() (*Conn, error) {
	l.mu.Lock()
	addrs := l.addrs
	l.mu.Unlock()
	var errs []error
	for _, a := range addrs {
		addr, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ctx, cancel := context.WithTimeout(l.e.ctx, handshakeTimeout)
		qc, err := l.e.tr.Dial(ctx, addr, l.e.opts.Identity.ClientConfig(l.peer), dialConfig())
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		return newConn(qc, l.peer), nil
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("relay %q has no endpoints", l.peer)
	}
	return nil, errors.Join(errs...)
}
