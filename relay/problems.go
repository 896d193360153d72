package relay

import (
	"sort"
	"sync"
	"time"

	"github.com/hoplink/hoplink/adminapi"
)

// problemBook keeps the latest problem of each kind and Tunnel that only
// this relay sees (a target that refuses, a handshake refused, a device
// that cannot open), bounded, for the operator to read over the admin API
// and turn into conditions and Events.
type problemBook struct {
	mu    sync.Mutex
	byKey map[[2]string]*adminapi.Problem
}

func (b *problemBook) add(kind, tunnel, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey == nil {
		b.byKey = map[[2]string]*adminapi.Problem{}
	}
	k := [2]string{kind, tunnel}
	p := b.byKey[k]
	if p == nil {
		if len(b.byKey) >= adminapi.MaxProblems {
			b.evictOldestLocked()
		}
		p = &adminapi.Problem{Kind: kind, Tunnel: tunnel}
		b.byKey[k] = p
	}
	p.Count++
	p.Last, p.At = msg, time.Now().UTC()
}

func (b *problemBook) evictOldestLocked() {
	var oldest [2]string
	var at time.Time
	for k, p := range b.byKey {
		if at.IsZero() || p.At.Before(at) {
			oldest, at = k, p.At
		}
	}
	delete(b.byKey, oldest)
}

// list returns the problems, newest first.
func (b *problemBook) list() []adminapi.Problem {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]adminapi.Problem, 0, len(b.byKey))
	for _, p := range b.byKey {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	return out
}
