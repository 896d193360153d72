package tlslink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/srcaddr"
)

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
		src := srcaddr.Of(raw.RemoteAddr())
		switch victim := e.handshakes.start(raw, src, time.Now()); victim {
		case nil:
		case raw: // every place is a known source's
			e.handshake("accept", "failed")
			raw.Close()
			continue
		default: // made room: the oldest of the source that holds the most
			e.handshake("accept", "failed")
			victim.Close() // its handshake fails and ends
		}
		go func() {
			// The place is given back once the handshake ends (or, should
			// serve panic, at the latest here).
			defer e.handshakes.end(raw)
			e.serve(tls.Server(wrap(raw), conf), func() bool { return e.handshakes.end(raw) })
		}()
	}
}

// serve handshakes c, then serves it; handshaken gives its place back and
// says false if it was taken to make room (c is being closed).
func (e *Endpoint) serve(c *tls.Conn, handshaken func() bool) {
	ctx, cancel := context.WithTimeout(e.ctx, handshakeTimeout)
	err := c.HandshakeContext(ctx)
	cancel()
	if !handshaken() && err == nil {
		err = errors.New("closed to make room for other handshakes")
	}
	if err != nil {
		c.Close() // a bad certificate was counted by the TLS config
		return
	}
	if c.ConnectionState().NegotiatedProtocol == pki.AdminALPN {
		e.serveAdmin(c)
		return
	}
	src := srcaddr.Of(c.RemoteAddr())
	peer, err := pki.PeerName(c.ConnectionState())
	if err == nil && !e.known(peer) {
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
	e.handshakes.learn(src, time.Now())
	if !e.track(c) {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	if old, whose := e.waiting.add(peer, c); old != nil {
		e.opts.Metrics.Rejected.WithLabelValues(e.opts.Name, "header_limit").Inc()
		e.warn.Warn("closed the oldest connection waiting for its header: too many wait", "transport", "tls",
			"peer", whose, "remote", old.RemoteAddr())
		old.NetConn().Close() // its handler sees the error and ends
	}
	defer e.Started(c) // at the latest
	if e.opts.Upper == nil {
		c.Close() // nothing above serves it
		return
	}
	e.opts.Upper.Serve(peer, c)
}

// waiting holds the connections of each peer that are authenticated and
// have not started a flow yet, oldest first (spares, and headers on their
// way), at most max in all and perPeer of one peer (MaxWaiting,
// MaxWaitingPerPeer; tests take less).
type waiting struct {
	max, perPeer int

	mu    sync.Mutex
	conns map[string][]*tls.Conn
	whose map[*tls.Conn]string
}

// add counts c among the connections of peer that wait for their flow to
// start, and returns the one to close to make room, if any, with its
// peer: the oldest of peer past its share, else past the total the oldest
// of the peer that holds the most (peer itself on a tie).
func (w *waiting) add(peer string, c *tls.Conn) (old *tls.Conn, whose string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conns == nil {
		w.conns, w.whose = map[string][]*tls.Conn{}, map[*tls.Conn]string{}
	}
	switch {
	case len(w.conns[peer]) >= w.perPeer:
		whose = peer
	case len(w.whose) >= w.max:
		whose = peer
		for p, cs := range w.conns {
			if len(cs) > len(w.conns[whose]) {
				whose = p
			}
		}
	}
	if cs := w.conns[whose]; whose != "" && len(cs) > 0 {
		old = cs[0]
		w.removeLocked(old)
	}
	w.conns[peer] = append(w.conns[peer], c)
	w.whose[c] = peer
	return old, whose
}

// remove stops counting c: its flow started, or it closed.
func (w *waiting) remove(c *tls.Conn) {
	w.mu.Lock()
	w.removeLocked(c)
	w.mu.Unlock()
}

func (w *waiting) removeLocked(c *tls.Conn) {
	peer, ok := w.whose[c]
	if !ok {
		return
	}
	delete(w.whose, c)
	cs := slices.DeleteFunc(w.conns[peer], func(x *tls.Conn) bool { return x == c })
	if len(cs) == 0 {
		delete(w.conns, peer)
		return
	}
	w.conns[peer] = cs
}

// Started tells the endpoint that c's flow has started (its header was
// read): it no longer counts as waiting, and is never closed to make room
// for others. The handler calls it; serve does once the handler returns.
func (e *Endpoint) Started(c *tls.Conn) { e.waiting.remove(c) }

func (e *Endpoint) track(c *tls.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return false
	}
	e.active[c] = struct{}{}
	return true
}

// Done tells the endpoint a connection's flow has ended and it is closed.
func (e *Endpoint) Done(c *tls.Conn) {
	e.mu.Lock()
	delete(e.active, c)
	e.mu.Unlock()
	e.waiting.remove(c)
}
