package linkemu

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepPrecise blocks the calling thread for d. The kernel wakes a thread
// up to its timer slack (50 µs by default) late; one nanosecond of slack
// makes the sleep as exact as the scheduler allows.
func sleepPrecise(d time.Duration) {
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Nanosleep(&ts, nil)
}
