package tlslink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/hoplink/hoplink/pki"
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
	if e.opts.Upper == nil {
		c.Close() // nothing above serves it
		return
	}
	e.opts.Upper.Serve(peer, c)
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

// Done tells the endpoint a connection's flow has ended and it is closed.
func (e *Endpoint) Done(c *tls.Conn) {
	e.mu.Lock()
	delete(e.active, c)
	e.unwaitLocked(c)
	e.mu.Unlock()
}
