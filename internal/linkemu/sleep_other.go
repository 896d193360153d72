//go:build !linux

package linkemu

import "time"

// preciseTimer: elsewhere Go's own timers.
type preciseTimer struct{}

func newPreciseTimer() *preciseTimer        { return &preciseTimer{} }
func (*preciseTimer) sleep(d time.Duration) { time.Sleep(d) }
func (*preciseTimer) close()                {}
