package main

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// After its drain, a process whose relays do not finish closing (a host
// too busy to run them) exits anyway: when the close has taken its limit,
// or at once on another signal.
func TestShutDownDoesNotWaitForeverForTheClose(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	stop := func() error { <-stuck; return nil }
	drain := func(context.Context) int { return 0 }
	for _, tc := range []struct {
		name  string
		limit time.Duration
		again bool // another signal during the close
	}{
		{"limit", 100 * time.Millisecond, false},
		{"another signal", time.Hour, true},
	} {
		sigs := make(chan os.Signal, 2)
		done := make(chan error, 1)
		d, unserve := drain, func() {}
		if tc.again {
			// Without a drain nothing else reads the signals.
			d, unserve = nil, func() { sigs <- syscall.SIGTERM }
		}
		go func() { done <- shutDown(sigs, testutil.Logger(), d, time.Second, unserve, stop, tc.limit) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still shutting down after 10 s", tc.name)
		}
	}
}
