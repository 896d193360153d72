package hop

import (
	"io"
	"sync"
	"time"
)

// Frames gathers a session's frames for one write to W: a session in
// stream mode sends a burst in full-size packets (or records), not a
// packet per datagram. Safe for concurrent use.
type Frames struct {
	W io.Writer
	// Stall, if set, bounds every write to W (which then must have
	// SetWriteDeadline): one that takes longer fails with
	// os.ErrDeadlineExceeded, and may have written part of its frames, so
	// the session must end. For an owner that writes for many sessions
	// from one goroutine (a UDP Tunnel's entry): a session whose next hop
	// stopped reading then costs the others at most Stall, once.
	Stall time.Duration

	mu  sync.Mutex
	buf []byte
}

// framesFlushAt is how much Queue lets wait for Flush.
const framesFlushAt = 32 << 10

// Queue frames p after those waiting, and writes them all once
// framesFlushAt wait.
func (f *Frames) Queue(p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.buf = AppendFrame(f.buf, p)
	if len(f.buf) < framesFlushAt {
		return nil
	}
	return f.flushLocked()
}

// Flush writes the frames waiting, if any, in one write.
func (f *Frames) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flushLocked()
}

type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

func (f *Frames) flushLocked() error {
	if len(f.buf) == 0 {
		return nil
	}
	if f.Stall > 0 {
		if d, ok := f.W.(writeDeadliner); ok {
			d.SetWriteDeadline(time.Now().Add(f.Stall))
		}
	}
	_, err := f.W.Write(f.buf)
	if cap(f.buf) > 2*framesFlushAt+2+MaxFrame {
		f.buf = nil // a burst of large frames: give its buffer back
	} else {
		f.buf = f.buf[:0]
	}
	return err
}
