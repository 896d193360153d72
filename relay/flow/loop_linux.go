//go:build linux

package flow

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
		// A loop's thread waits in epoll_wait, a system call, holding its
		// P; the runtime's monitor takes such a P back after 20 µs for
		// the other goroutines, and when no P is idle it wakes a thread
		// to spin for work that is not there. A P more per loop leaves
		// one idle, so that it does not: at the same latency, the relays
		// of one hop used 151 µs of CPU a request where they now use 125
		// (hack/bench/rr.sh). The loops' threads are busy only while
		// they move bytes, as a goroutine copying would be.
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + len(loopsAll))
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
	// The thread is the loop's alone: its reads and writes are raw system
	// calls between polls, and the poll itself is the one call the
	// scheduler is told of, so that the P goes to other work meanwhile.
	runtime.LockOSThread()
	evs := make([]unix.EpollEvent, 256)
	for {
		wait := int(loopSweep / time.Millisecond)
		if len(l.ready) > 0 {
			wait = 0
		}
		n, err := unix.EpollWait(l.ep, evs, wait)
		if err != nil && err != unix.EINTR {
			panic("flow loop: epoll_wait: " + err.Error())
		}
		l.turn(evs[:max(n, 0)])
	}
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
