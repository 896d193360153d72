//go:build linux

package flow

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event loops carry the flows whose both ends are sockets a relay reads
// and writes itself: a TCP client or target, or a TLS connection to a peer
// relay. Each loop is one goroutine with its own epoll set; a flow belongs
// to one loop, which reads a message from one end and writes it to the
// other in one turn, with no goroutine woken between.
//
// Why not a goroutine per direction, as Join does for the other flows:
// Go's runtime polls the network from one thread at a time. A burst of
// messages for a relay (a client's timers firing together, answers
// arriving together) is found by that thread, which runs one and queues
// the rest, then wakes a second thread for them; on two cores, with the
// clients and the other relays also running, the second thread often
// waits for a core, and the messages wait in the runtime's queue
// (hack/bench/rr.sh with execution traces: 230-300 µs per message on
// average, ten times the 28 µs it took to move one). A loop is woken
// once for all its flows' messages of a burst and moves them one after
// the other, each read followed by its write; Go's poller wakes a
// handful of loops where it woke a goroutine per message.
type evLoop struct {
	ep   int // epoll
	wake int // eventfd: posted work
	// file and rc are the epoll set's descriptor as Go's poller waits on it.
	file *os.File
	rc   syscall.RawConn

	mu     sync.Mutex
	posted []func()

	// Owned by the loop's goroutine:
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
	loopsWant = 0 // SetLoops; -1: GOMAXPROCS
	loopsOnce sync.Once
	loopsAll  []*evLoop
	loopsNext atomic.Uint64
)

// SetLoops sets how many event loops carry socket-to-socket flows (the
// relay's --flow-loops, -1 there: GOMAXPROCS); 0, the package's default
// (in-process relays of tests and hoplink local), carries every flow on
// goroutines. It must be called before the first flow.
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
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	file := os.NewFile(uintptr(ep), "flow-loop")
	rc, err := file.SyscallConn()
	if err != nil {
		file.Close()
		unix.Close(wake)
		return nil, err
	}
	return &evLoop{
		ep: ep, wake: wake, file: file, rc: rc,
		ends:    map[int32]*lend{},
		flows:   map[*lflow]struct{}{},
		scratch: make([]byte, copyBufSize),
	}, nil
}

// post runs fn on the loop's goroutine.
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
	// The loop waits on Go's poller, as any socket does: its epoll set's
	// descriptor is readable while the set holds events. So a loop is an
	// ordinary goroutine to the runtime, needs no P or thread of its own
	// and costs nothing while idle; a burst for it is one wake-up.
	//
	// A loop on a thread of its own, waiting in epoll_wait while holding
	// an extra P, added less at p50 (0.86 against this way's 1.2 ms
	// through one TLS hop) but made the QUIC flows of the same relays
	// 0.3-0.6 ms slower: docs/benchmarks.md.
	f, rc := l.file, l.rc
	evs := make([]unix.EpollEvent, 256)
	n := 0
	poll := func(uintptr) bool {
		n = epollNow(l.ep, evs)
		return n > 0
	}
	for {
		n = epollNow(l.ep, evs)
		if n == 0 && len(l.ready) == 0 {
			// Bounded, for the idle sweep.
			f.SetReadDeadline(time.Now().Add(loopSweep))
			rc.Read(poll)
		}
		l.turn(evs[:n])
	}
}

// epollNow is epoll_wait without waiting, as a raw system call (it never
// blocks, so the scheduler need not hear of it); 0 on any error. It is
// epoll_pwait with no signal mask, which every Linux architecture has
// (arm64 has no epoll_wait).
func epollNow(ep int, evs []unix.EpollEvent) int {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0
		}
		return int(r)
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
