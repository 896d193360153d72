package tlslink

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// handshakes holds the connections accepted and not yet authenticated:
// before a client has proved who it is, it must not cost the relay without
// bound, nor keep the relay's peers and the operator out. At most max at
// once and perSource from one source (an IPv4 address or an IPv6 /64).
//
// Past a bound the new connection is taken and an older one closed, so
// that whoever fills the table first does not keep it: a handshake takes
// a round trip or two, so the oldest one left is the one least likely to
// finish. The one closed is the oldest of the new connection's source when
// that source is at its share, else the oldest of the source holding the
// most. Sources that authenticated lately (peers, the operator, addresses
// this relay dialed a peer at) are known: an unknown source's connection
// never closes a known source's, and a known one takes an unknown one's
// place first, so a flood from elsewhere cannot keep the relay's peers or
// its admin out however many addresses it comes from.
type handshakes struct {
	max, perSource int

	mu    sync.Mutex
	conns map[net.Conn]*handshake
	bySrc map[netip.Prefix]int
	// known sources, until when they count as known.
	known map[netip.Prefix]time.Time
}

type handshake struct {
	src   netip.Prefix
	known bool
	since time.Time
}

const (
	// knownFor is how long a source that authenticated stays known: past
	// a pool's spare lifetime and the operator's report interval, so a
	// peer or operator keeps its standing as long as it keeps talking.
	knownFor = 10 * time.Minute
	// maxKnown bounds the known sources; past it, new ones are not
	// learned until old ones expire (a relay talks to far fewer).
	maxKnown = 4096
)

func newHandshakes(max, perSource int) *handshakes {
	return &handshakes{max: max, perSource: perSource,
		conns: map[net.Conn]*handshake{}, bySrc: map[netip.Prefix]int{}, known: map[netip.Prefix]time.Time{}}
}

// start counts c, from src, as handshaking and returns the connection to
// close to make room: nil, an older one (c is counted), or c itself (it
// is not: every place is a known source's and c's is not).
func (h *handshakes) start(c net.Conn, src netip.Prefix, now time.Time) (victim net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hs := &handshake{src: src, since: now}
	if until, ok := h.known[src]; ok && now.Before(until) {
		hs.known = true
	}
	switch {
	case h.bySrc[src] >= h.perSource:
		victim = h.pickLocked(func(o *handshake) bool { return o.src == src })
	case len(h.conns) >= h.max:
		victim = h.pickLocked(func(o *handshake) bool { return !o.known })
		if victim == nil && hs.known {
			victim = h.pickLocked(func(*handshake) bool { return true })
		}
		if victim == nil {
			return c
		}
	}
	if victim != nil {
		h.forgetLocked(victim)
	}
	h.conns[c] = hs
	h.bySrc[src]++
	return victim
}

// pickLocked returns, among the connections that may go, the oldest of the
// source that holds the most of them (nil if none may).
func (h *handshakes) pickLocked(may func(*handshake) bool) net.Conn {
	held := map[netip.Prefix]int{}
	for _, o := range h.conns {
		if may(o) {
			held[o.src]++
		}
	}
	var v net.Conn
	var vs *handshake
	for c, o := range h.conns {
		if !may(o) {
			continue
		}
		if v == nil || held[o.src] > held[vs.src] || held[o.src] == held[vs.src] && o.since.Before(vs.since) {
			v, vs = c, o
		}
	}
	return v
}

// end stops counting c: its handshake ended, or it was closed. It says
// whether c was still counted: false after an earlier end, or when c was
// taken to make room (and is being closed, so must not be served).
func (h *handshakes) end(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.forgetLocked(c)
}

func (h *handshakes) forgetLocked(c net.Conn) bool {
	o, ok := h.conns[c]
	if !ok {
		return false
	}
	delete(h.conns, c)
	if h.bySrc[o.src]--; h.bySrc[o.src] <= 0 {
		delete(h.bySrc, o.src)
	}
	return true
}

// learn makes src known until now+knownFor: a peer or the operator proved
// who it is from there, or this relay reached a peer there.
func (h *handshakes) learn(src netip.Prefix, now time.Time) {
	if !src.IsValid() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.known[src]; !ok && len(h.known) >= maxKnown {
		for s, until := range h.known {
			if !now.Before(until) {
				delete(h.known, s)
			}
		}
		if len(h.known) >= maxKnown {
			return
		}
	}
	h.known[src] = now.Add(knownFor)
}

// inProgress is how many handshakes are counted.
func (h *handshakes) inProgress() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}
