package adminapi

import (
	"context"
	"sync"
	"time"
)

// Board is what a relay publishes for other clusters' operators: its
// cluster's clusterset report (package clusterset), as the operator stored
// it, under a version that changes with it. Readers wait on it for a
// change rather than ask again and again.
type Board struct {
	mu      sync.Mutex
	data    []byte
	version string
	changed chan struct{} // closed, and replaced, at every change
}

// NewBoard makes an empty Board.
func NewBoard() *Board { return &Board{changed: make(chan struct{})} }

// Set publishes data under version; nil data empties the board.
func (b *Board) Set(data []byte, version string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if version == b.version {
		return
	}
	b.data, b.version = data, version
	close(b.changed)
	b.changed = make(chan struct{})
}

// Get returns what the board holds, at once, or after waiting up to wait
// for a version other than after (the one the reader holds). changed is
// false when the wait ended with the version still after.
func (b *Board) Get(ctx context.Context, after string, wait time.Duration) (data []byte, version string, changed bool) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		data, version, ch := b.data, b.version, b.changed
		b.mu.Unlock()
		if version != after || wait <= 0 {
			return data, version, version != after
		}
		select {
		case <-ch:
		case <-t.C:
			return data, version, false
		case <-ctx.Done():
			return data, version, false
		}
	}
}
