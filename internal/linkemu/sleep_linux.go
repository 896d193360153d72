package linkemu

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// preciseTimer wakes a goroutine at a sub-millisecond deadline: a timerfd
// read through Go's network poller, which returns when the kernel's
// high-resolution timer fires. The waiting goroutine holds no thread and
// no P, so the pipes of one process do not stall each other (a sleeping
// system call would hold its P until the runtime takes it back, up to
// milliseconds later).
type preciseTimer struct {
	f  *os.File
	fd int
}

func newPreciseTimer() *preciseTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	return &preciseTimer{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
}

// sleep returns after d.
func (t *preciseTimer) sleep(d time.Duration) {
	if t == nil {
		time.Sleep(d)
		return
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(d.Nanoseconds(), 1))}
	if unix.TimerfdSettime(t.fd, 0, &spec, nil) != nil {
		time.Sleep(d)
		return
	}
	var expirations [8]byte
	t.f.Read(expirations[:])
}

func (t *preciseTimer) close() {
	if t != nil {
		t.f.Close()
	}
}
