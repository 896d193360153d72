package quic

import (
	"net"
	"time"
)

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

// Loss sums what the connections this relay dialed to peer sent, in
// packets, and lost (quic-go's counts, over each connection's life; since
// copies made up for the link's loss, the counts that turned them on,
// until the link shows itself clean without copies).
func (ls *Links) Loss(peer string) (sent, lost uint64) {
	ls.mu.Lock()
	var links []*Link
	for k, l := range ls.links {
		if k.peer == peer {
			links = append(links, l)
		}
	}
	ls.mu.Unlock()
	var hidden counts
	for _, l := range links {
		if c := l.Live(); c != nil {
			cur := c.lossCounts()
			sent += cur.sent
			lost += cur.lost
			if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok {
				if j, on := ls.e.red.hidden(ua.AddrPort()); on {
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
func (ls *Links) Answering(peer string, ok bool) {
	if ok {
		ls.silent.Delete(peer)
	} else {
		ls.silent.Store(peer, true)
	}
	// peer_up follows the probes, not only the connection: a relay
	// killed without a word keeps its connection up here until QUIC's
	// idle timeout, seconds after its probes stopped coming back.
	if l, _ := ls.controlLinks(peer); l != nil && ls.e.opts.Metrics != nil {
		ls.e.opts.Metrics.PeerUp.WithLabelValues(ls.e.opts.Name, peer).Set(boolFloat(ok && l.Live() != nil))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// PeerLost reports whether peer's connection is known lost: it timed
// out, ended after the peer's drain, or a dial failed, and none is up
// since. Unlike PeerDown, a probe round that went unanswered while the
// connection stays up does not count: its probes may have been dropped
// in a full queue or answered late by a busy host, and the connection
// still carries flows.
func (ls *Links) PeerLost(peer string) bool { return ls.down(peer, true) }

// PeerDown reports whether peer is known unreachable now: it answered no
// probe of the last round, or its connection timed out or a dial failed
// and none is up since.
//
// A peer of replicas (a sidecar RelayNode) is down only once every
// replica's link is: a probe round reaches one replica, so its silence
// says nothing of the others.
func (ls *Links) PeerDown(peer string) bool { return ls.down(peer, false) }

// down is PeerDown, or PeerLost when lost: silence counts then only
// without a live connection.
func (ls *Links) down(peer string, lost bool) bool {
	l, replicas := ls.controlLinks(peer)
	if l == nil && len(replicas) > 0 {
		for _, r := range replicas {
			if !r.Down() {
				return false
			}
		}
		return true
	}
	if _, silent := ls.silent.Load(peer); silent && (!lost || l == nil || l.Live() == nil) {
		return true
	}
	return l != nil && l.Down()
}
