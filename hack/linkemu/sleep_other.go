//go:build !linux

package linkemu

import "time"

func sleepPrecise(d time.Duration) { time.Sleep(d) }
