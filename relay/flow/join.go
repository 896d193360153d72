package flow

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Counter counts the bytes of one direction (a Prometheus counter).
type Counter interface{ Add(float64) }

// copyBufSize is the buffer a flow borrows while bytes are moving. Flows
// borrow it from a pool only once data is ready to read and give it back as
// soon as the source is drained, so an idle flow holds no buffer at all:
// that is what keeps ten thousand open flows cheap.
const copyBufSize = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// tlsBufPool serves TLS sources, which hold their buffer while idle; a TLS
// read returns at most one 16 KiB record anyway.
var tlsBufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// ErrIdle is a flow that moved no byte either way for its idle timeout.
var ErrIdle = errors.New("flow idle")

// idleTimer resets a flow that moves no byte for a while.
type idleTimer struct {
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleTimer(d time.Duration, abort func()) *idleTimer {
	it := &idleTimer{d: d}
	if d > 0 {
		it.t = time.AfterFunc(d, func() {
			it.fired.Store(true)
			abort()
		})
	}
	return it
}

// moved says bytes moved: the idle time starts again.
func (it *idleTimer) moved() {
	if it.t != nil {
		it.t.Reset(it.d)
	}
}

func (it *idleTimer) stop(err error) error {
	if it.t != nil {
		it.t.Stop()
	}
	if it.fired.Load() {
		return ErrIdle
	}
	return err
}

// Join moves bytes both ways between a (toward the client) and b (toward
// the target) until both directions end, counting up (a to b) and down.
// EOF in one direction half-closes the other end; an error anywhere resets
// both ends, and so does idle (when not 0) passing without a byte either
// way, which Join then reports as ErrIdle. Backpressure is natural: a side
// that cannot write stops its reader, and QUIC flow control stops the
// sender upstream.
func Join(a, b End, up, down Counter, idle time.Duration) error {
	it := newIdleTimer(idle, func() { a.Abort(); b.Abort() })
	done := make(chan error, 1)
	go func() {
		err := copyHalf(b, a, up, it)
		if err != nil {
			a.Abort()
			b.Abort()
		}
		done <- err
	}()
	err := copyHalf(a, b, down, it)
	if err != nil {
		a.Abort()
		b.Abort()
	}
	err = it.stop(errors.Join(err, <-done))
	if err == nil {
		a.Close()
		b.Close()
	}
	return err
}

// gatherer is a source that returns little per Read (a TLS record) but can
// add what already arrived behind it without blocking.
type gatherer interface {
	ReadReady([]byte) (int, error)
}

func copyHalf(dst, src End, n Counter, it *idleTimer) error {
	pool := &bufPool
	g, gathers := src.(gatherer)
	if gathers {
		pool = &tlsBufPool
	}
	for {
		if err := src.Wait(); err != nil && err != io.EOF {
			return err
		}
		bp := pool.Get().(*[]byte)
		buf := *bp
		for {
			nr, rerr := src.Read(buf)
			out := buf[:nr]
			var big *[]byte
			if gathers && rerr == nil && nr == len(buf) {
				// A full record: bulk. Gather what follows it into a
				// large buffer, borrowed only for this write; the small
				// one goes back meanwhile, so a flow blocked on a slow
				// reader holds 64 KiB, as any other does.
				big = bufPool.Get().(*[]byte)
				copy(*big, out)
				pool.Put(bp)
				var m int
				m, rerr = g.ReadReady((*big)[nr:])
				out = (*big)[:nr+m]
			}
			if len(out) > 0 {
				_, werr := dst.Write(out)
				if big != nil {
					bufPool.Put(big)
					bp = pool.Get().(*[]byte)
					buf = *bp
				}
				if werr != nil {
					pool.Put(bp)
					return werr
				}
				n.Add(float64(len(out)))
				it.moved()
			}
			if rerr == io.EOF {
				pool.Put(bp)
				return dst.CloseWrite()
			}
			if rerr != nil {
				pool.Put(bp)
				return rerr
			}
			if nr < len(buf) {
				break // drained for now: give the buffer back while we wait
			}
		}
		pool.Put(bp)
	}
}

// spliceChunk bounds each splice call so byte counters move during long
// transfers; splice itself copies in the kernel, with no user-space buffer.
const spliceChunk = 4 << 20

// Splice joins two TCP connections in the kernel, as a plain port forward
// does: io.CopyN between *net.TCPConn uses splice(2) on Linux. idle is as
// Join's.
func Splice(a, b *net.TCPConn, up, down Counter, idle time.Duration) error {
	ta, tb := &TCPEnd{c: a}, &TCPEnd{c: b}
	armReset(a)
	armReset(b)
	// The kernel moves the bytes, so the kernel says when they last moved:
	// when the timer fires, it looks at both sockets' last receipt and
	// waits on if either had data since.
	it := &idleTimer{d: idle}
	if idle > 0 {
		it.t = time.AfterFunc(idle, func() {
			quiet := min(sinceReceived(a), sinceReceived(b))
			if quiet < idle {
				it.t.Reset(idle - quiet)
				return
			}
			it.fired.Store(true)
			ta.Abort()
			tb.Abort()
		})
	}
	half := func(dst, src *net.TCPConn, n Counter) error {
		for {
			w, err := io.CopyN(dst, src, spliceChunk)
			n.Add(float64(w))
			if err == io.EOF {
				return closeWrite(dst)
			}
			if err != nil {
				return err
			}
		}
	}
	done := make(chan error, 1)
	go func() {
		err := half(b, a, up)
		if err != nil {
			ta.Abort()
			tb.Abort()
		}
		done <- err
	}()
	err := half(a, b, down)
	if err != nil {
		ta.Abort()
		tb.Abort()
	}
	err = it.stop(errors.Join(err, <-done))
	a.Close()
	b.Close()
	return err
}
