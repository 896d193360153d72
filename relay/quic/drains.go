package quic

import (
	"context"
	"time"

	"github.com/hoplink/hoplink/relay/hop"
)

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
	link := c.dialed || (c.admitted.Load() && !e.links.dials(c.Peer))
	e.mu.Lock()
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
	e.event(Event{Kind: PeerDraining, Peer: c.Peer})
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
