package nexthop

import (
	"slices"
	"sync"
)

// liveTCPConns bounds the TCP connections of TLS flows kept per peer,
// newest first: enough to show a link's loss, few enough to read at once.
const liveTCPConns = 16

// openTLS is a TLS flow's end while it is open (a *flow.TLSEnd).
type openTLS interface {
	SegmentsSoFar() (sent, retransmitted uint32)
}

// liveTCP holds the TCP connections of the TLS flows open to each peer.
// What they sent and retransmitted so far shows a link's loss before the
// flows end: a long download, or a flow that ends only after the next one
// of its Tunnel chose (a middle relay hears of an end last).
type liveTCP struct {
	mu    sync.Mutex
	conns map[string][]openTLS
}

func (l *liveTCP) add(peer string, c openTLS) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		l.conns = map[string][]openTLS{}
	}
	cs := l.conns[peer]
	if len(cs) >= liveTCPConns {
		cs = slices.Delete(cs, 0, 1)
	}
	l.conns[peer] = append(cs, c)
}

func (l *liveTCP) remove(peer string, c openTLS) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs := slices.DeleteFunc(l.conns[peer], func(x openTLS) bool { return x == c })
	if len(cs) == 0 {
		delete(l.conns, peer)
		return
	}
	l.conns[peer] = cs
}

// counts sums what the open connections to peer sent and retransmitted,
// in segments.
func (l *liveTCP) counts(peer string) (sent, retransmitted uint64) {
	l.mu.Lock()
	cs := slices.Clone(l.conns[peer])
	l.mu.Unlock()
	for _, c := range cs {
		s, r := c.SegmentsSoFar()
		sent += uint64(s)
		retransmitted += uint64(r)
	}
	return sent, retransmitted
}
