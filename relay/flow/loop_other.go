//go:build !linux

package flow

import "time"

// SetLoops has no effect: event loops are Linux's (epoll).
func SetLoops(int) {}

// loopJoin leaves every flow to Join's goroutines.
func loopJoin(End, End, Counter, Counter, time.Duration) (error, bool) { return nil, false }

type lend struct{}

func (*lend) Close() error { return nil }

func (*lend) segments() (sent, retransmitted uint32) { return 0, 0 }
