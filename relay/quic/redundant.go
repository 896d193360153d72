package quic

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Redundancy: on a link that loses packets, a lone packet (one that is not
// part of a GSO batch, so an interactive flow's request or answer, an ACK,
// a UDP datagram) goes out twice. QUIC drops the copy it already has, so
// the second costs bandwidth only; where the first was lost the second
// saves a probe timeout, about 30 ms with quic-go (its 25 ms maximum ACK
// delay is part of every probe timeout) where a packet takes a fraction of
// a millisecond. It was seed 002's question: 1,000 sequential echoes over
// a LAN with 1% loss took bare quic-go 0.8-1.0 s and 0.34 s with lone
// packets sent twice; lossless, 0.32 s (internal/linkemu, 100 µs each way).
//
// Bulk is left alone: GSO batches go once, and a budget per destination
// bounds the copies, so a UDP Tunnel at line rate is not doubled.
const (
	// redundantLost in redundantWindow packets sent to an address (0.1%)
	// turn copies on for it. Any loss costs an interactive flow a probe
	// timeout, so the bar is low (a chain of three links losing 1% end to
	// end loses 0.33% on each); the window keeps a stray loss of a quiet
	// link from counting. The losses are the larger of quic-go's count and
	// the one the peer reports (counts.go), which includes the lone
	// packets quic-go's probe timeouts recovered without counting.
	redundantLost   = 2
	redundantWindow = 2000
	// redundantHold is how long copies go on once turned on. With copies,
	// quic-go hardly sees a loss, so the loss cannot say when to stop: the
	// copies stop after this, and start again once the loss shows again
	// (two losses on a lossy link, once a minute).
	redundantHold = time.Minute
	// redundantRate and redundantBurst are the budget of copies per
	// destination, per second: a thousand echoes a second fit, a UDP
	// Tunnel's hundreds of thousands of datagrams do not (at most about
	// 23 Mbit/s of copies to one address).
	redundantRate  = 2000
	redundantBurst = 100
	// lossSample is how often the loss is sampled.
	lossSample = 250 * time.Millisecond
)

// redundancy decides, per remote address, whether lone packets go twice.
type redundancy struct {
	any   atomic.Bool // some address is on: the send path looks no further when not
	mu    sync.Mutex
	peers map[netip.AddrPort]*redundantPeer
	// last holds each connection's counts at the last sample.
	last map[*Conn]counts
	// changed is told when an address turns on or off, with the loss seen.
	changed func(addr netip.AddrPort, on bool, loss float64)
	// copies counts the packets sent a second time.
	copies func()
}

type redundantPeer struct {
	sent, lost uint64 // the window being judged
	// copied: copies went during the window, so its loss says little.
	copied bool
	// judged is the window that last turned copies on, the link's loss as
	// known, until a window sent without copies shows too little loss.
	judged counts
	until  time.Time // copies go until then
	budget *rate.Limiter
}

func newRedundancy(changed func(netip.AddrPort, bool, float64), copies func()) *redundancy {
	return &redundancy{peers: map[netip.AddrPort]*redundantPeer{}, last: map[*Conn]counts{},
		changed: changed, copies: copies}
}

// counts are packets sent and lost.
type counts struct{ sent, lost uint64 }

// since is what was sent and lost between prev and c. quic-go's lost count
// goes down when a packet it declared lost arrives after all; that step
// counts as no loss, never as a wrapped-around huge one.
func (c counts) since(prev counts) counts {
	var d counts
	if c.sent > prev.sent {
		d.sent = c.sent - prev.sent
	}
	if c.lost > prev.lost {
		d.lost = c.lost - prev.lost
	}
	return d
}

// sample takes every connection's counts (quic-go's, over its life) and
// judges the loss to each remote address. One goroutine calls it.
func (r *redundancy) sample(conns []*Conn, now time.Time) {
	by := map[netip.AddrPort]counts{}
	seen := make(map[*Conn]counts, len(conns))
	for _, c := range conns {
		ua, ok := c.RemoteAddr().(*net.UDPAddr)
		if !ok {
			continue
		}
		cur := c.lossCounts()
		seen[c] = cur
		addr := canonical(ua.AddrPort())
		d, step := by[addr], cur.since(r.last[c])
		d.sent += step.sent
		d.lost += step.lost
		by[addr] = d
	}
	r.last = seen // connections gone are forgotten
	r.judge(by, now)
}

// judge adds what each address's connections sent and lost since the last
// sample to its window, and turns copies on or off.
func (r *redundancy) judge(by map[netip.AddrPort]counts, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, d := range by {
		p := r.peers[addr]
		if p == nil {
			p = &redundantPeer{budget: rate.NewLimiter(redundantRate, redundantBurst)}
			r.peers[addr] = p
		}
		p.sent += d.sent
		p.lost += d.lost
		p.copied = p.copied || now.Before(p.until)
		switch {
		case p.lost >= redundantLost:
			if !now.Before(p.until) && r.changed != nil {
				// Losses declared now may be of packets counted in an
				// earlier window: the ratio is at most 1.
				r.changed(addr, true, min(1, float64(p.lost)/float64(max(p.sent, 1))))
			}
			p.until = now.Add(redundantHold)
			p.judged = counts{p.sent, p.lost}
			p.sent, p.lost, p.copied = 0, 0, true
		case p.sent >= redundantWindow:
			if !p.copied {
				// A window sent as the link takes it, and it lost too
				// little: clean, as far as anyone can tell. Copies
				// ending say nothing of the kind: they end on time.
				p.judged = counts{}
			}
			p.sent, p.lost, p.copied = 0, 0, now.Before(p.until)
		}
	}
	anyOn := false
	for addr, p := range r.peers {
		switch {
		case now.Before(p.until):
			anyOn = true
		case !p.until.IsZero():
			p.until = time.Time{}
			if r.changed != nil {
				r.changed(addr, false, 0)
			}
		case by[addr] == (counts{}) && p.judged == (counts{}):
			delete(r.peers, addr) // quiet, off and clean: nothing to remember
		}
	}
	r.any.Store(anyOn)
}

// hidden returns the loss that last turned copies to addr on, while they
// go and after, until a window sent without them shows too little loss:
// the link's, which quic-go no longer sees once the copies make up for it,
// and which their end on time does not take away.
func (r *redundancy) hidden(addr netip.AddrPort) (counts, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peers[canonical(addr)]
	if p == nil || p.judged == (counts{}) {
		return counts{}, false
	}
	return p.judged, true
}

// copy reports whether a lone packet to addr should go a second time now,
// taking it from the address's budget.
func (r *redundancy) copy(addr netip.AddrPort, now time.Time) bool {
	if !r.any.Load() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peers[canonical(addr)]
	if p == nil || !now.Before(p.until) {
		return false
	}
	if !p.budget.AllowN(now, 1) {
		return false
	}
	if r.copies != nil {
		r.copies()
	}
	return true
}

// canonical unmaps an IPv4 address written as IPv6, as a dual-stack socket
// reports it, so both spellings are one destination.
func canonical(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
