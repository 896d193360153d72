package flow

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Counter counts the bytes of one direction (a Prometheus counter).
type Counter interface{ Add(float64) }

// A Pacer is a Counter that also holds its direction to a rate: a half
// asks it before each write, so what a flow sends never runs ahead of its
// allowance. gone says whether the flow failed meanwhile, which ends the
// wait (the write then fails as it would have).
type Pacer interface {
	Counter
	Pace(n int, gone func() bool)
}

// tryPacer is a Pacer that can say, without waiting, that a write of n
// bytes may go now (taking its allowance), or that it must wait: an event
// loop then waits for Pace on a goroutine of its own.
type tryPacer interface {
	TryPace(n int) bool
}

// copyBufSize is the buffer a flow borrows while bytes are moving. Flows
// borrow it from a pool only once data is ready to read and give it back as
// soon as the source is drained, so an idle flow holds no buffer at all:
// that is what keeps ten thousand open flows cheap.
const copyBufSize = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// smallBufPool serves the first read after a source was drained. Most such
// reads of a request/response flow bring a small message, and taking 64
// KiB for each (zeroed when the pool is empty, which it is after every
// garbage collection) was most of what a relay allocated per request,
// which in turn set how often it collected. A read that fills the small
// buffer moves the rest of the burst to a large one.
const smallBufSize = 4 << 10

var smallBufPool = sync.Pool{New: func() any { b := make([]byte, smallBufSize); return &b }}

// tlsBufPool serves TLS sources, which hold their buffer while idle; a TLS
// read returns at most one 16 KiB record anyway.
var tlsBufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// ErrIdle is a flow that moved no byte either way for its idle timeout.
var ErrIdle = errors.New("flow idle")

// Side is an end of a joined flow: A toward the client, B toward the
// target.
type Side int

const (
	A Side = iota
	B
)

// Broken is a joined flow that ended in an error: which end failed first
// (the other was reset for it), and the errors of both halves.
type Broken struct {
	At  Side
	Err error
}

func (e *Broken) Error() string { return e.Err.Error() }
func (e *Broken) Unwrap() error { return e.Err }

// firstFault keeps the side whose failure came first: the other half's
// error is the reset that failure caused.
type firstFault struct {
	set  atomic.Bool
	side atomic.Int32
}

func (f *firstFault) note(side Side) {
	if f.set.CompareAndSwap(false, true) {
		f.side.Store(int32(side))
	}
}

// failed is the side of a half that failed: its source's, or its
// destination's.
func failed(srcFailed bool, src, dst Side) Side {
	if srcFailed {
		return src
	}
	return dst
}

// broken wraps err, if any, with the side that failed first.
func (f *firstFault) broken(err error) error {
	if err == nil || !f.set.Load() {
		return err
	}
	return &Broken{At: Side(f.side.Load()), Err: err}
}

// idleTimer resets a flow that moves no byte for a while. Bytes moving
// only note the time: a small request/response flow moves bytes a few
// hundred times a second, and resetting a runtime timer each time cost
// more than the timer firing once per idle period to look.
type idleTimer struct {
	d     time.Duration
	t     *time.Timer
	last  atomic.Int64 // now() when bytes last moved
	fired atomic.Bool

	mu      sync.Mutex
	stopped bool
}

func newIdleTimer(d time.Duration, abort func()) *idleTimer {
	it := &idleTimer{d: d}
	if d > 0 {
		it.last.Store(int64(now()))
		it.t = time.AfterFunc(time.Hour, func() {
			it.mu.Lock()
			if it.stopped {
				it.mu.Unlock()
				return
			}
			if quiet := now() - time.Duration(it.last.Load()); quiet < it.d {
				it.t.Reset(it.d - quiet)
				it.mu.Unlock()
				return
			}
			it.fired.Store(true)
			it.mu.Unlock()
			abort()
		})
		it.t.Reset(d)
	}
	return it
}

// moved says bytes moved: the idle time starts again.
func (it *idleTimer) moved() {
	if it.t != nil {
		it.last.Store(int64(now()))
	}
}

func (it *idleTimer) stop(err error) error {
	if it.t != nil {
		it.mu.Lock()
		it.stopped = true
		it.mu.Unlock()
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
// way, which Join then reports as ErrIdle; a flow its QUIC connection's
// Window reset for a new flow ends in ErrStalled. Backpressure is natural:
// a side that cannot write stops its reader, and QUIC flow control stops
// the sender upstream.
//
// Flows whose both ends are sockets (TCP, or TLS over TCP) ride an event
// loop (loop_linux.go); the rest a goroutine per direction.
func Join(a, b End, up, down Counter, idle time.Duration) error {
	if err, ok := loopJoin(a, b, up, down, idle); ok {
		return err
	}
	return joinHalves(a, b, up, down, idle)
}

// joinHalves is Join on a goroutine per direction.
func joinHalves(a, b End, up, down Counter, idle time.Duration) error {
	abort := func() { a.Abort(); b.Abort() }
	it := newIdleTimer(idle, abort)
	var fault firstFault
	wa, wb := newStallWatch(a, b, A, &fault, abort), newStallWatch(b, a, B, &fault, abort)
	ended := func() bool { return fault.set.Load() || it.fired.Load() }
	done := make(chan error, 1)
	go func() {
		srcFailed, err := copyHalf(b, a, up, it, wa, ended)
		if err != nil {
			fault.note(failed(srcFailed, A, B))
			abort()
		}
		done <- err
	}()
	srcFailed, err := copyHalf(a, b, down, it, wb, ended)
	if err != nil {
		fault.note(failed(srcFailed, B, A))
		abort()
	}
	err = it.stop(errors.Join(err, <-done))
	wa.stop()
	wb.stop()
	if wa.wasEvicted() || wb.wasEvicted() {
		return ErrStalled
	}
	if err == nil {
		a.Close()
		b.Close()
		return nil
	}
	if err == ErrIdle {
		return err
	}
	return fault.broken(err)
}

// gatherer is a source that returns little per Read (a TLS record, or a
// TCP read into a small buffer) but can add what already arrived behind
// it without blocking.
type gatherer interface {
	ReadReady([]byte) (int, error)
}

// A half that waits in one write for stallCheck has the end it copies from
// looked at for a reset, then again at doubling intervals up to
// stallCheckMax: a spliced flow's half waits for reads inside its writes,
// so an idle spliced flow is looked at too, rarely.
const (
	stallCheck    = time.Second
	stallCheckMax = 4 * time.Second
)

// stallWatch looks, while a half is stuck writing, at the end it reads
// from. Nothing reads that end meanwhile, so a reset of it (a client that
// gave up) would otherwise wait for the write, which may never come (a
// target that stopped reading), and hold the flow until its idle timeout.
// A half that writes to a QUIC stream is also, once its write has waited
// stalledFor, one its connection's Window may reset for a new flow. A
// write only notes when it began (and 0 when it ended); the process's one
// sweeper (stallWatches) looks at every watch each stallSweep and acts
// on a write under way for stallCheck or more. A timer per half, armed by
// the writes, fired about once a second per half of every flow of a
// request/response Tunnel, each firing a goroutine of its own: wake-ups
// of the relay's threads in proportion to its flows, where the sweeper
// wakes a few times a second whatever their number.
type stallWatch struct {
	src   breakable // nil when src cannot tell a reset without a read
	abort func()
	// A reset of src is noted in fault as the flow's first failure, at
	// the side src is: the write aborted for it fails too, later.
	at    Side
	fault *firstFault
	// since is when the write under way began (now), 0 between writes.
	since atomic.Int64
	// win is the Window of dst's connection, nil when dst is no stream
	// of a shared QUIC connection.
	win     *Window
	dst     *StreamEnd
	evicted atomic.Bool // its Window reset the flow

	mu      sync.Mutex
	stopped bool // stop was called, or the watch aborted its flow
	stuck   bool // in win.stuck
	// The looks at one write: at stallCheck into it, then at intervals
	// (gap) that double up to stallCheckMax. looked is the since of the
	// write they are at, due when the next is, from that write's start.
	looked   int64
	due, gap time.Duration
	// slot is the watch's index in stallWatches.all, under its lock.
	slot int
}

// newStallWatch watches a half copying from src (the flow's side at) to
// dst; nil when there is nothing to watch.
func newStallWatch(src, dst End, at Side, fault *firstFault, abort func()) *stallWatch {
	b, _ := src.(breakable)
	var win *Window
	se, _ := dst.(*StreamEnd)
	if se != nil {
		win = se.win
	}
	if b == nil && win == nil {
		return nil
	}
	w := &stallWatch{src: b, abort: abort, at: at, fault: fault, win: win}
	if win != nil {
		w.dst = se
	}
	stallWatches.add(w)
	return w
}

// write brackets a write: on is true before it, false after.
func (w *stallWatch) write(on bool) {
	if w == nil {
		return
	}
	if !on {
		w.since.Store(0)
		return
	}
	w.since.Store(int64(now()))
}

// look is the sweeper's look at the watch, at time t (now).
func (w *stallWatch) look(t time.Duration) {
	s := w.since.Load()
	if s == 0 || t-time.Duration(s) < stallCheck {
		return // between writes, or in one too young to look at
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if s != w.looked {
		w.looked, w.due, w.gap = s, stallCheck, stallCheck
	}
	if t-time.Duration(s) < w.due {
		return
	}
	if w.src != nil && w.src.Broken() {
		w.stopped = true
		w.fault.note(w.at)
		// On a goroutine of its own: the sweep of every other flow
		// goes on, whatever closing this one's ends takes.
		go w.abort()
		return
	}
	if w.win != nil && !w.stuck {
		w.stuck = true
		w.win.add(w)
	}
	w.gap = min(2*w.gap, stallCheckMax)
	w.due += w.gap
}

// stop ends the watch for good, before the flow's ends are closed.
func (w *stallWatch) stop() {
	if w == nil {
		return
	}
	stallWatches.remove(w)
	w.mu.Lock()
	w.stopped = true
	stuck := w.stuck
	w.stuck = false
	w.mu.Unlock()
	if stuck {
		w.win.remove(w)
	}
}

// stallSweep is how often the sweeper looks at the watches: a look comes
// at most this much later than it is due.
const stallSweep = 100 * time.Millisecond

// sweeper looks at every stall watch of the process from one goroutine,
// every stallSweep while there are any.
type sweeper struct {
	mu      sync.Mutex
	all     []*stallWatch
	running bool
	batch   []*stallWatch // what one sweep looks at, reused
}

var stallWatches sweeper

func (s *sweeper) add(w *stallWatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.slot = len(s.all)
	s.all = append(s.all, w)
	if !s.running {
		s.running = true
		go s.run()
	}
}

func (s *sweeper) remove(w *stallWatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := w.slot
	if i < 0 || i >= len(s.all) || s.all[i] != w {
		return
	}
	last := len(s.all) - 1
	s.all[i] = s.all[last]
	s.all[i].slot = i
	s.all[last] = nil
	s.all = s.all[:last]
	w.slot = -1
}

func (s *sweeper) run() {
	t := time.NewTicker(stallSweep)
	defer t.Stop()
	for range t.C {
		s.mu.Lock()
		if len(s.all) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		if cap(s.batch) > 4*len(s.all)+1024 {
			s.batch = nil // a crowd of flows left: let its array go
		}
		s.batch = append(s.batch[:0], s.all...)
		batch := s.batch
		s.mu.Unlock()
		t0 := now()
		for _, w := range batch {
			w.look(t0)
		}
		clear(batch) // hold no finished flow
	}
}

// wasEvicted says whether the Window reset the flow for a new one.
func (w *stallWatch) wasEvicted() bool { return w != nil && w.evicted.Load() }

// copyHalf copies src to dst until src ends. An error says whether src
// (a read) or dst (a write) failed.
func copyHalf(dst, src End, n Counter, it *idleTimer, w *stallWatch, failed func() bool) (srcFailed bool, err error) {
	pacer, _ := n.(Pacer)
	gone := func() bool {
		b, ok := src.(breakable)
		return failed() || ok && b.Broken()
	}
	cut, _ := src.(cutTeller)
	first := &smallBufPool
	if _, ok := src.(*TLSEnd); ok {
		first = &tlsBufPool
	}
	g, gathers := src.(gatherer)
	ready, _ := src.(readyReader)
	for {
		var (
			bp     *[]byte
			nr     int
			rerr   error
			primed bool // nr and rerr hold the first read already
		)
		if ready != nil {
			bp, nr, rerr = ready.ReadWhenReady(first)
			if bp == nil {
				return true, rerr
			}
			primed = true
		} else {
			if err := src.Wait(); err != nil && err != io.EOF {
				return true, err
			}
			bp = first.Get().(*[]byte)
		}
		pool := first // where bp goes back to
		buf := *bp
		for {
			if !primed {
				nr, rerr = src.Read(buf)
			}
			primed = false
			out := buf[:nr]
			var big *[]byte
			if gathers && rerr == nil && nr == len(buf) {
				// A full record, or a full small buffer: bulk. Gather
				// what follows it into a large buffer, borrowed only
				// for this write; the small one goes back meanwhile,
				// so a flow blocked on a slow reader holds 64 KiB, as
				// any other does.
				big = bufPool.Get().(*[]byte)
				copy(*big, out)
				pool.Put(bp)
				var m int
				m, rerr = g.ReadReady((*big)[nr:])
				out = (*big)[:nr+m]
			}
			if len(out) > 0 {
				if pacer != nil {
					pacer.Pace(len(out), gone)
				}
				w.write(true)
				_, werr := dst.Write(out)
				w.write(false)
				if big != nil {
					bufPool.Put(big)
					bp = pool.Get().(*[]byte)
					buf = *bp
				}
				if werr != nil {
					pool.Put(bp)
					return false, werr
				}
				n.Add(float64(len(out)))
				it.moved()
			}
			if rerr == io.EOF && (failed() || cut != nil && cut.cutEOF()) {
				rerr = errCutEOF
			}
			if rerr == io.EOF {
				pool.Put(bp)
				return false, dst.CloseWrite()
			}
			if rerr != nil {
				pool.Put(bp)
				return true, rerr
			}
			if nr < len(buf) {
				break // drained for now: give the buffer back while we wait
			}
			if !gathers && pool != &bufPool {
				// The small buffer came back full from a source that
				// cannot gather: read the rest in large pieces.
				pool.Put(bp)
				pool = &bufPool
				bp = pool.Get().(*[]byte)
				buf = *bp
			}
		}
		pool.Put(bp)
	}
}

// errCutEOF is a TCP source's end of stream that was a reset (cutEOF).
var errCutEOF = os.NewSyscallError("read", syscall.ECONNRESET)

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
	abort := func() { ta.Abort(); tb.Abort() }
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
			abort()
		})
	}
	half := func(dst, src *TCPEnd, n Counter, w *stallWatch) error {
		for {
			w.write(true)
			m, err := io.CopyN(dst.c, src.c, spliceChunk)
			w.write(false)
			n.Add(float64(m))
			if err == io.EOF && src.cutEOF() {
				return errCutEOF
			}
			if err == io.EOF {
				return dst.CloseWrite()
			}
			if err != nil {
				return err
			}
		}
	}
	// splice(2) does not say which socket failed: a write to a socket its
	// peer reset fails with EPIPE, a read of it with ECONNRESET.
	side := func(err error, src, dst Side) Side {
		if errors.Is(err, syscall.EPIPE) {
			return dst
		}
		return src
	}
	var fault firstFault
	wa, wb := newStallWatch(ta, tb, A, &fault, abort), newStallWatch(tb, ta, B, &fault, abort)
	done := make(chan error, 1)
	go func() {
		err := half(tb, ta, up, wa)
		if err != nil {
			fault.note(side(err, A, B))
			abort()
		}
		done <- err
	}()
	err := half(ta, tb, down, wb)
	if err != nil {
		fault.note(side(err, B, A))
		abort()
	}
	err = it.stop(errors.Join(err, <-done))
	wa.stop()
	wb.stop()
	a.Close()
	b.Close()
	if err == nil || err == ErrIdle {
		return err
	}
	return fault.broken(err)
}
