package metricsrv

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/hoplink/hoplink/srcaddr"
)

// connTable is a listener that keeps at most max connections open. Past
// it, a new connection is always taken and another one closed to make room:
// one of the source (IPv4 address, IPv6 /64) that holds the most, among
// those the one not in a request (new or idle) the longest, else the
// longest in one. So a flood from a few hosts recycles its own connections,
// while the kubelet's probe, one short connection, gets through; refusing
// the new one instead would let whoever fills the table first keep it.
type connTable struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns map[net.Conn]*connState
	bySrc map[netip.Prefix]int
	// evicted counts connections closed to make room (for tests).
	evicted int
}

type connState struct {
	src   netip.Prefix
	busy  bool      // reading or answering a request
	since time.Time // when it last changed between busy and not
}

func newConnTable(ln net.Listener, max int) *connTable {
	return &connTable{Listener: ln, max: max, conns: map[net.Conn]*connState{}, bySrc: map[netip.Prefix]int{}}
}

// Accept takes the next connection, closing another if the table is full.
func (t *connTable) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	src := srcaddr.Of(c.RemoteAddr())
	t.mu.Lock()
	var victim net.Conn
	if len(t.conns) >= t.max {
		victim = t.victimLocked()
		t.forgetLocked(victim)
		t.evicted++
	}
	t.conns[c] = &connState{src: src, since: time.Now()}
	t.bySrc[src]++
	t.mu.Unlock()
	if victim != nil {
		victim.Close() // its server goroutine sees the error and ends
	}
	return c, nil
}

// victimLocked picks the connection to close: see connTable.
func (t *connTable) victimLocked() net.Conn {
	var v net.Conn
	var vs *connState
	for c, s := range t.conns {
		if v == nil || t.worse(s, vs) {
			v, vs = c, s
		}
	}
	return v
}

// worse says whether a is a better connection to close than b.
func (t *connTable) worse(a, b *connState) bool {
	if na, nb := t.bySrc[a.src], t.bySrc[b.src]; na != nb {
		return na > nb
	}
	if a.busy != b.busy {
		return !a.busy
	}
	return a.since.Before(b.since)
}

func (t *connTable) forgetLocked(c net.Conn) {
	s, ok := t.conns[c]
	if !ok {
		return
	}
	delete(t.conns, c)
	if t.bySrc[s.src]--; t.bySrc[s.src] <= 0 {
		delete(t.bySrc, s.src)
	}
}

// track is the server's ConnState hook.
func (t *connTable) track(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st {
	case http.StateActive, http.StateIdle:
		if s := t.conns[c]; s != nil {
			s.busy, s.since = st == http.StateActive, time.Now()
		}
	case http.StateClosed, http.StateHijacked:
		t.forgetLocked(c)
	}
}

// open is how many connections the table holds.
func (t *connTable) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}
