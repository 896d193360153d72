//go:build linux

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

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/relay/sockio"
)

// lflow is a flow on an event loop. Everything in it but gone and result
// belongs to the loop's goroutine.
type lflow struct {
	l        *evLoop
	a, b     *lend
	up, down *ldir
	idle     time.Duration
	last     int64 // nanotime of the last byte moved
	fault    firstFault
	over     bool
	// added: the loop has the flow's sockets. An end that failed before
	// (an Abort while the flow was being set up) leaves its error in
	// early, for add to end the flow with.
	added     bool
	early     error
	earlySide Side
	gone      atomic.Bool // the flow ended: a pacing goroutine stops waiting
	pacers    sync.WaitGroup
	result    chan error
}

// lend is one end of a flow on a loop: its socket, a duplicate of the
// end's descriptor that only the loop holds (Go's poller no longer does),
// and for a TLS end the TLS connection that reads and writes through it.
type lend struct {
	f  *lflow
	fd int
	// fdMu orders setting and closing fd with segments, the one reader
	// outside the loop.
	fdMu sync.Mutex
	side Side
	tls  *TLSEnd // nil for a TCP end
	// out is what was written to the end but not yet taken by its socket;
	// the direction that writes to it reads nothing more meanwhile, so it
	// holds at most one read's worth (and TLS's records of it).
	out    *[]byte
	outOff int
	werr   error // a write failed: TLS's writes come through Write
	// drained: a read took less than it asked for, so the socket held no
	// more then; more raises a new edge, so the next read can be skipped
	// until an event. A FIN already in (rdhup) still needs its read.
	drained, rdhup bool
	from           *ldir // the direction reading this end
	to             *ldir // the direction writing to it
}

// ldir is one direction of a flow on a loop.
type ldir struct {
	f        *lflow
	src, dst *lend
	n        Counter
	pacer    Pacer // nil when the direction is not paced
	// chunk is the size of the write under way, counted once the socket
	// took all of it.
	chunk  int
	eof    bool // the source ended cleanly
	closed bool // the destination's write side was closed (after eof)
	done   bool // closed and flushed
	pacing bool // a goroutine waits for the pacer
	queued bool // in the loop's ready list
}

// errWouldBlock is a TLS end's socket holding nothing more to read now.
// crypto/tls keeps a partial record for the next Read when the error is
// temporary, which this is.
var errWouldBlock error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "socket would block" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

var _ net.Error = wouldBlock{}

// maxPending bounds what an end holds unsent: a direction's read and its
// TLS records, and some of TLS's own.
const maxPending = 2*copyBufSize + 16<<10

var errPendingFull = errors.New("flow loop: too much unsent for a socket that takes nothing")

// outPool holds the ends' pending output: a read and its TLS records.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, copyBufSize+1024); return &b }}

// loopJoin carries a flow on an event loop when both ends are sockets the
// relay reads itself; ok false leaves the flow to Join's goroutines.
func loopJoin(a, b End, up, down Counter, idle time.Duration) (err error, ok bool) {
	ta, okA := takeable(a)
	tb, okB := takeable(b)
	if !okA || !okB {
		return nil, false
	}
	l := pickLoop()
	if l == nil {
		return nil, false
	}
	f := &lflow{l: l, idle: idle, result: make(chan error, 1)}
	f.a = &lend{f: f, side: A, fd: -1}
	f.b = &lend{f: f, side: B, fd: -1}
	f.a.tls, _ = a.(*TLSEnd)
	f.b.tls, _ = b.(*TLSEnd)
	f.up = &ldir{f: f, src: f.a, dst: f.b, n: up}
	f.down = &ldir{f: f, src: f.b, dst: f.a, n: down}
	f.up.pacer, _ = up.(Pacer)
	f.down.pacer, _ = down.(Pacer)
	f.a.from, f.a.to = f.up, f.down
	f.b.from, f.b.to = f.down, f.up
	fdA, err := ta(f.a)
	if err != nil {
		return nil, false // closed already: Join's goroutines see it too
	}
	f.a.setFD(fdA)
	fdB, errB := tb(f.b)
	if errB != nil {
		// The first end is the loop's now: it resets it for the second,
		// which is reset here as Join's goroutines would.
		b.Abort()
	} else {
		f.b.setFD(fdB)
	}
	l.count.Add(1)
	l.post(func() { l.add(f, errB) })
	err = <-f.result
	// A pacer's wait ends within its step once the flow is gone; what it
	// counted must be settled before the caller releases the flow's share.
	f.pacers.Wait()
	return err, true
}

// takeable says whether e is an end a loop can carry, and how to take its
// socket: the returned func gives the loop a duplicate of the descriptor
// and closes the end's own, after which the end's Abort, and a close of
// its TLS connection, reset the flow through the loop.
func takeable(e End) (func(*lend) (int, error), bool) {
	switch t := e.(type) {
	case *TCPEnd:
		if t.io == nil || t.rc == nil {
			return nil, false
		}
		return t.takeover, true
	case *TLSEnd:
		tc, ok := t.c.NetConn().(interface {
			Takeover(func(fd uintptr) (io.ReadWriteCloser, error)) error
		})
		if !ok || t.rc == nil {
			return nil, false
		}
		return func(le *lend) (int, error) {
			fd := -1
			err := tc.Takeover(func(s uintptr) (io.ReadWriteCloser, error) {
				d, err := dupFD(s)
				fd = d
				if err == nil {
					t.lo.Store(le)
				}
				return le, err
			})
			return fd, err
		}, true
	}
	return nil, false
}

// dupFD duplicates a socket's descriptor (close-on-exec).
func dupFD(fd uintptr) (int, error) {
	d, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("fcntl", err)
	}
	return d, nil
}

// takeover hands the socket to a loop (takeable).
func (t *TCPEnd) takeover(le *lend) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.aborted {
		return -1, net.ErrClosed
	}
	fd := -1
	var err error
	if cerr := t.rc.Control(func(s uintptr) { fd, err = dupFD(s) }); cerr != nil {
		return -1, cerr
	}
	if err != nil {
		return -1, err
	}
	t.lo = le
	t.c.Close() // the duplicate keeps the socket: no reset, no FIN
	return fd, nil
}

// add starts f on the loop; errB is the second end's failure to be
// taken, if any.
func (l *evLoop) add(f *lflow, errB error) {
	l.flows[f] = struct{}{}
	f.last = nanotime()
	f.added = true
	if errB != nil {
		f.fail(errB, B)
		return
	}
	if f.early != nil {
		f.fail(f.early, f.earlySide)
		return
	}
	for _, e := range []*lend{f.a, f.b} {
		ev := &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(e.fd)}
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, e.fd, ev); err != nil {
			f.fault.note(e.side)
			f.end(os.NewSyscallError("epoll_ctl", err), e.side)
			return
		}
		l.ends[int32(e.fd)] = e
	}
	// What arrived before the loop had the sockets, in them or held by
	// TLS, raises no new edge: read it now.
	f.up.pump()
	f.down.pump()
}

// event is what epoll said of the end's socket.
func (e *lend) event(ev uint32) {
	f := e.f
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		e.drained = false
		if ev&(unix.EPOLLRDHUP|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			e.rdhup = true
		}
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 && !f.over {
		e.to.pump()
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLERR|unix.EPOLLHUP) != 0 && !f.over {
		d := e.from
		if d.blocked() {
			// Nothing reads the end while its direction waits to write,
			// but a reset of it must end the flow now: the write may
			// never finish (a target that stopped reading).
			if ev&unix.EPOLLERR != 0 {
				if err := e.resetErr(); err != nil {
					f.fail(err, e.side)
				}
			}
			return
		}
		d.pump()
	}
}

// blocked says whether the direction waits: for its destination's socket
// to take what it holds, or for its pacer.
func (d *ldir) blocked() bool { return d.pacing || d.dst.pending() > 0 }

// resetErr is the error a reset left on the socket, if any, taken
// without reading: data still queued would come first to a read (or a
// peek). Its state would not say: a socket whose both directions closed
// cleanly reads as CLOSE too, once it went to TIME_WAIT.
func (e *lend) resetErr() error {
	v, err := unix.GetsockoptInt(e.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil || v == 0 {
		return nil
	}
	return os.NewSyscallError("read", syscall.Errno(v))
}

// loopBudget is how many reads a direction makes in one turn.
const loopBudget = 4

// pump moves what it can: first what the destination still holds, then
// what the source has, until the source holds nothing, the destination
// takes no more, or the turn's budget runs out.
func (d *ldir) pump() {
	f := d.f
	if f.over || d.done || d.pacing {
		return
	}
	if d.dst.pending() > 0 {
		drained, err := d.dst.flush()
		if err != nil {
			f.fail(err, d.dst.side)
			return
		}
		if !drained {
			return
		}
	}
	if d.chunk > 0 {
		d.counted()
	}
	if d.eof {
		d.closeWrite()
		return
	}
	buf := f.l.scratch
	for range loopBudget {
		n, err := d.read(buf)
		if n > 0 && !d.send(buf[:n]) {
			return // waits for the destination, or the pacer; or failed
		}
		switch {
		case err == errWouldBlock:
			return
		case err == io.EOF:
			d.eof = true
			d.closeWrite()
			return
		case err != nil:
			f.fail(err, d.src.side)
			return
		}
	}
	if !d.queued {
		d.queued = true
		f.l.ready = append(f.l.ready, d)
	}
}

// read reads the source into b: a TCP end once; a TLS end record by
// record while b has room for another, so bulk leaves in large writes. An
// error after some bytes comes back at the next read (TLS keeps it).
func (d *ldir) read(b []byte) (int, error) {
	e := d.src
	if e.tls == nil {
		return e.Read(b)
	}
	n := 0
	for {
		m, err := e.tls.Read(b[n:])
		n += m
		if err != nil {
			if n > 0 {
				return n, nil
			}
			return 0, err
		}
		if len(b)-n < maxRecord {
			return n, nil
		}
	}
}

// send writes b to the destination, once its pacer allows; false when the
// direction must wait (the socket is full, or the pacer holds it) or the
// flow failed.
func (d *ldir) send(b []byte) bool {
	if d.pacer != nil {
		tp, ok := d.pacer.(tryPacer)
		if !ok || !tp.TryPace(len(b)) {
			d.paceLater(b)
			return false
		}
	}
	return d.write(b)
}

// paceLater waits for the pacer on a goroutine (a loop never waits), then
// writes b on the loop.
func (d *ldir) paceLater(b []byte) {
	f := d.f
	held := outPool.Get().(*[]byte)
	*held = append((*held)[:0], b...)
	d.pacing = true
	f.pacers.Add(1)
	go func() {
		defer f.pacers.Done()
		d.pacer.Pace(len(*held), f.gone.Load)
		f.l.post(func() {
			d.pacing = false
			if !f.over {
				d.write(*held)
			}
			outPool.Put(held)
			// On, including a flush of what the destination held
			// before: its socket's edge may have come while the
			// direction waited here, and it comes once.
			if !f.over {
				d.pump()
			}
		})
	}()
}

// write hands b to the destination: false while its socket has not taken
// all of it (counted when it has), or when the write failed.
func (d *ldir) write(b []byte) bool {
	d.chunk = len(b)
	var err error
	if d.dst.tls != nil {
		_, err = d.dst.tls.Write(b)
	} else {
		_, err = d.dst.Write(b)
	}
	if err == nil {
		err = d.dst.werr
	}
	if err != nil {
		d.f.fail(err, d.dst.side)
		return false
	}
	if d.dst.pending() > 0 {
		return false
	}
	d.counted()
	return true
}

func (d *ldir) counted() {
	d.n.Add(float64(d.chunk))
	d.chunk = 0
	d.f.last = nanotime()
}

// closeWrite ends the destination's writes once the source ended and all
// it sent is out: a TCP FIN (the reset armed for a crash lifted first), a
// TLS close_notify; the direction is done when that too is out.
func (d *ldir) closeWrite() {
	f := d.f
	if !d.closed {
		d.closed = true
		var err error
		if d.dst.tls != nil {
			err = d.dst.tls.CloseWrite()
			if err == nil {
				err = d.dst.werr
			}
		} else {
			unix.SetsockoptLinger(d.dst.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{})
			if e := unix.Shutdown(d.dst.fd, unix.SHUT_WR); e != nil {
				err = os.NewSyscallError("shutdown", e)
			}
		}
		if err != nil {
			f.fail(err, d.dst.side)
			return
		}
	}
	if d.dst.pending() > 0 {
		return
	}
	d.done = true
	if f.up.done && f.down.done {
		f.finish(nil)
	}
}

// fail ends the flow for err, which the end at side caused.
func (f *lflow) fail(err error, side Side) {
	f.fault.note(side)
	f.end(err, side)
}

// end resets both ends (unless err is nil: both directions ended cleanly)
// and gives Join its result.
func (f *lflow) end(err error, side Side) {
	if f.over {
		return
	}
	if !f.added {
		if f.early == nil {
			f.early, f.earlySide = err, side
		}
		return
	}
	if err == ErrIdle {
		f.finish(ErrIdle)
		return
	}
	f.fault.note(side)
	f.finish(f.fault.broken(err))
}

// finish takes the flow off the loop and closes its sockets: with a reset
// when the flow failed, cleanly when err is nil.
func (f *lflow) finish(err error) {
	f.over = true
	f.gone.Store(true)
	l := f.l
	for _, e := range []*lend{f.a, f.b} {
		if e.fd < 0 {
			continue
		}
		if l.ends[int32(e.fd)] == e {
			unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, e.fd, nil)
			delete(l.ends, int32(e.fd))
		}
		if e.tls != nil {
			e.tls.once.Do(func() {
				e.tls.segs[0], e.tls.segs[1] = segmentsOf(e.fd)
				e.tls.done()
			})
		}
		if err != nil {
			unix.SetsockoptLinger(e.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
		}
		e.setFD(-1)
		if e.out != nil {
			outPool.Put(e.out)
			e.out = nil
		}
	}
	delete(l.flows, f)
	l.count.Add(-1)
	f.result <- err
}

// Read reads the socket: errWouldBlock when it holds nothing now.
func (e *lend) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if e.drained && !e.rdhup {
		return 0, errWouldBlock
	}
	for {
		n, errno := sockio.Read(uintptr(e.fd), b)
		switch errno {
		case 0:
			if n == 0 {
				return 0, io.EOF
			}
			e.drained = n < len(b)
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errWouldBlock
		}
		return 0, os.NewSyscallError("read", errno)
	}
}

// Write writes b to the socket, keeping what it does not take now for
// flush. It fails only when the socket did.
func (e *lend) Write(b []byte) (int, error) {
	if e.werr != nil {
		return 0, e.werr
	}
	n := len(b)
	if e.pending() == 0 {
		m, err := e.writeNow(b)
		if err != nil {
			e.werr = err
			return m, err
		}
		b = b[m:]
	}
	if len(b) > 0 {
		if e.pending()+len(b) > maxPending {
			// Only TLS's own records come on top of a direction's one
			// read (a KeyUpdate answered per record a peer sends): a peer
			// that asks for them without reading costs its flow, not
			// the relay's memory.
			e.werr = errPendingFull
			return 0, e.werr
		}
		if e.out == nil {
			e.out = outPool.Get().(*[]byte)
			*e.out = (*e.out)[:0]
			e.outOff = 0
		}
		*e.out = append(*e.out, b...)
	}
	return n, nil
}

// Close, from outside the loop (a relay closing its connections, an
// Abort), resets the flow.
func (e *lend) Close() error {
	e.f.l.post(func() { e.f.fail(net.ErrClosed, e.side) })
	return nil
}

// writeNow writes what the socket takes now.
func (e *lend) writeNow(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, errno := sockio.Write(uintptr(e.fd), b[n:])
		switch errno {
		case 0:
			n += m
		case unix.EINTR:
		case unix.EAGAIN:
			return n, nil
		default:
			return n, os.NewSyscallError("write", errno)
		}
	}
	return n, nil
}

func (e *lend) pending() int {
	if e.out == nil {
		return 0
	}
	return len(*e.out) - e.outOff
}

// flush writes what the end holds: drained when all of it is out.
func (e *lend) flush() (drained bool, err error) {
	m, err := e.writeNow((*e.out)[e.outOff:])
	e.outOff += m
	if err != nil {
		e.werr = err
		return false, err
	}
	if e.pending() > 0 {
		return false, nil
	}
	outPool.Put(e.out)
	e.out = nil
	e.outOff = 0
	return true, nil
}

// setFD gives the end its socket, or closes it (-1).
func (e *lend) setFD(fd int) {
	e.fdMu.Lock()
	defer e.fdMu.Unlock()
	if fd < 0 && e.fd >= 0 {
		unix.Close(e.fd)
	}
	e.fd = fd
}

// segments is what the end's socket sent and retransmitted so far; called
// from outside the loop.
func (e *lend) segments() (sent, retransmitted uint32) {
	e.fdMu.Lock()
	defer e.fdMu.Unlock()
	if e.fd < 0 {
		return 0, 0
	}
	return segmentsOf(e.fd)
}
