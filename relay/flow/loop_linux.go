//go:build linux

package flow

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event loops carry the flows whose both ends are sockets a relay reads
// and writes itself: a TCP client or target, or a TLS connection to a peer
// relay. Each loop is one OS thread with its own epoll set; a flow belongs
// to one loop, which reads a message from one end and writes it to the
// other on that thread, with no goroutine woken between.
//
// Why not a goroutine per direction, as Join does for the other flows:
// Go's runtime polls the network from one thread at a time. A burst of
// messages for a relay (a client's timers firing together, answers
// arriving together) is found by that thread, which runs one and queues
// the rest, then wakes a second thread for them; on two cores, with the
// clients and the other relays also running, the second thread often
// waits for a core, and the messages wait in the runtime's queue
// (hack/bench/rr.sh with execution traces: 230-300 µs per message on
// average, ten times the 28 µs it took to move one). A peer such as
// haproxy runs one poller per thread, each over its own connections, as
// these loops do. A forwarder built both ways on the same machine and
// load (docs/benchmarks.md) added 0.15-0.2 ms less per message this way.
type evLoop struct {
	ep   int // epoll
	wake int // eventfd: posted work

	mu     sync.Mutex
	posted []func()

	// Owned by the loop's thread:
	ends    map[int32]*lend
	flows   map[*lflow]struct{}
	scratch []byte
	// ready holds directions whose source had more to read when their
	// turn's budget ran out: they go on after the next poll, so that one
	// busy flow does not hold the others' messages.
	ready     []*ldir
	lastSweep time.Time

	count atomic.Int64 // flows on the loop
}

// Loops are started at the first flow that can use them.
var (
	loopsWant = -1 // SetLoops; -1: GOMAXPROCS
	loopsOnce sync.Once
	loopsAll  []*evLoop
	loopsNext atomic.Uint64
)

// SetLoops sets how many event loops carry socket-to-socket flows (the
// relay's --flow-loops); 0 carries every flow on goroutines, as before
// there were loops. It must be called before the first flow.
func SetLoops(n int) { loopsWant = n }

// pickLoop is the loop with the fewest flows of two taken in turn, or nil
// when there are none.
func pickLoop() *evLoop {
	loopsOnce.Do(startLoops)
	switch len(loopsAll) {
	case 0:
		return nil
	case 1:
		return loopsAll[0]
	}
	i := loopsNext.Add(1)
	a, b := loopsAll[i%uint64(len(loopsAll))], loopsAll[(i+1)%uint64(len(loopsAll))]
	if b.count.Load() < a.count.Load() {
		return b
	}
	return a
}

func startLoops() {
	n := loopsWant
	if n < 0 {
		n = runtime.GOMAXPROCS(0)
	}
	for range n {
		l, err := newLoop()
		if err != nil {
			break // no loops: flows run on goroutines
		}
		loopsAll = append(loopsAll, l)
		go l.run()
	}
	if len(loopsAll) > 0 {
		// A loop waits in epoll_wait holding its P (epollRaw), as a
		// thread of its own: a P more for each, so that the relay's
		// other goroutines keep the Ps they had. The loops' threads use
		// a CPU only while they move bytes, as a goroutine copying would.
		morePs(len(loopsAll))
	}
}

func newLoop() (*evLoop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	return &evLoop{
		ep: ep, wake: wake,
		ends:    map[int32]*lend{},
		flows:   map[*lflow]struct{}{},
		scratch: make([]byte, copyBufSize),
	}, nil
}

// post runs fn on the loop's thread.
func (l *evLoop) post(fn func()) {
	l.mu.Lock()
	first := len(l.posted) == 0
	l.posted = append(l.posted, fn)
	l.mu.Unlock()
	if first {
		var one = [8]byte{1}
		unix.Write(l.wake, one[:])
	}
}

// loopSweep is how often a loop looks for idle flows.
const loopSweep = 500 * time.Millisecond

func (l *evLoop) run() {
	evs := make([]unix.EpollEvent, 256)
	held := true // the loop holds a P of its own (startLoops added it)
	lastFlow := time.Now()
	for {
		wait := int(loopSweep / time.Millisecond)
		if len(l.ready) > 0 {
			wait = 0
		}
		if len(l.flows) > 0 {
			lastFlow = time.Now()
		}
		var n int
		var err error
		switch {
		case held && time.Since(lastFlow) >= loopRetire:
			// Nothing carried for a while: give the P back, so that an
			// idle relay's loops cost nothing and its other goroutines
			// run with the Ps they had before there were loops.
			held = false
			morePs(-1)
			continue
		case !held && len(l.flows) == 0 && len(l.ready) == 0:
			// Wait as any blocking call does, the P given back.
			n, err = unix.EpollWait(l.ep, evs, -1)
			if err == nil || err == unix.EINTR {
				held = true
				lastFlow = time.Now()
				morePs(1)
			}
		default:
			n, err = epollRaw(l.ep, evs, wait)
		}
		if err == unix.EINTR {
			// The runtime's signal to stop (a collection, or the monitor
			// taking back a P held 10 ms), which comes every 10 ms to a
			// loop that waits: yield here, and go on with the turn (its
			// sweep would never come due on timeouts alone).
			runtime.Gosched()
			n, err = 0, nil
		}
		if err != nil {
			panic("flow loop: epoll_wait: " + err.Error())
		}
		l.turn(evs[:n])
	}
}

// loopRetire is how long a loop that carries nothing keeps its P.
const loopRetire = time.Minute

var psMu sync.Mutex

// morePs adds d Ps to GOMAXPROCS: one for each loop that holds one. A
// change stops the world for a moment; loops make one only when they
// start and when they have carried nothing for loopRetire.
func morePs(d int) {
	psMu.Lock()
	defer psMu.Unlock()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + d)
}

// epollRaw is epoll_wait as a raw system call: the loop keeps its P while
// it waits, as a thread of its own would, and the scheduler hears nothing.
// Each blocking call it is told of wakes the runtime's monitor thread
// from its sleep when the relay was idle, after which it polls every 20
// µs: with the poll told of, the relays of one hop made 2.8 context
// switches a request and used 128 µs of CPU for it; raw, see
// docs/benchmarks.md. A P per loop is added to GOMAXPROCS for it
// (startLoops). The runtime still stops the loop when it must: its
// signal ends the wait (EINTR).
func epollRaw(ep int, evs []unix.EpollEvent, msec int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// turn handles one poll's events, then what was posted, the directions
// left ready, and the idle sweep when due.
func (l *evLoop) turn(evs []unix.EpollEvent) {
	var drained [8]byte
	for _, ev := range evs {
		if int(ev.Fd) == l.wake {
			unix.Read(l.wake, drained[:])
			continue
		}
		if e := l.ends[ev.Fd]; e != nil {
			e.event(ev.Events)
		}
	}
	l.runPosted()
	if len(l.ready) > 0 {
		ready := l.ready
		l.ready = nil
		for _, d := range ready {
			d.queued = false
			d.pump()
		}
	}
	if now := time.Now(); now.Sub(l.lastSweep) >= loopSweep {
		l.lastSweep = now
		l.sweep(now)
	}
}

func (l *evLoop) runPosted() {
	l.mu.Lock()
	posted := l.posted
	l.posted = nil
	l.mu.Unlock()
	for _, fn := range posted {
		fn()
	}
}

// sweep ends the flows idle for their timeout.
func (l *evLoop) sweep(now time.Time) {
	t := nanotime()
	for f := range l.flows {
		if f.idle > 0 && time.Duration(t-f.last) >= f.idle && !f.over {
			f.end(ErrIdle, A)
		}
	}
}

// nanotime is a monotonic clock in nanoseconds.
func nanotime() int64 { return int64(now()) }
