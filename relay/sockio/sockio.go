//go:build linux

// Package sockio reads and writes a relay's sockets with raw system calls.
//
// Go's net package makes every read and write of a socket a system call
// the scheduler is told of (entersyscall), in case it blocks. A relay's
// sockets never block: they are non-blocking, and a read or write that
// would block returns EAGAIN, after which the goroutine waits on the
// network poller, not in the kernel. Telling the scheduler costs wake-ups:
// when a relay between two messages had every P idle, the runtime's
// monitor thread (sysmon) sleeps deeply, and the next such system call
// wakes it, after which it polls every 20 µs while any P runs; and a call
// that sysmon sees in the kernel on two polls in a row may have its P
// handed to another thread, woken for it. In a relay carrying
// request/response flows that was half the context switches of the relay
// process. Raw calls keep the P, as the calls run on it for the few
// microseconds a non-blocking socket call takes, and leave sysmon asleep.
//
// Conn does one socket's reads and writes this way, waiting on the poller
// (deadlines included) through the socket's syscall.RawConn; errors are
// what net's would be, io.EOF at the end of the stream.
package sockio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn does the reads and writes of one connected socket.
type Conn struct {
	rc   syscall.RawConn
	net  string
	addr net.Addr

	rmu sync.Mutex // one read at a time: r is its state
	r   op
	// The callbacks are made once: a closure made per call escapes to
	// the heap, an allocation per message.
	readFn, readNowFn func(fd uintptr) bool

	wmu     sync.Mutex
	w       op
	writeFn func(fd uintptr) bool
}

// op is the state of one read or write under way.
type op struct {
	b     []byte
	n     int
	errno syscall.Errno
	eof   bool
}

// New makes the Conn of c, a connection whose SyscallConn is a socket's
// (net.TCPConn, net.UDPConn); ok false when it has none.
func New(c interface {
	SyscallConn() (syscall.RawConn, error)
	LocalAddr() net.Addr
}) (*Conn, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	s := &Conn{rc: rc, addr: c.LocalAddr()}
	if s.addr != nil {
		s.net = s.addr.Network()
	}
	s.readFn, s.readNowFn, s.writeFn = s.readReady, s.readIfAny, s.writeAll
	return s, true
}

// Read reads what the socket holds into b, waiting on the poller while it
// holds nothing.
func (s *Conn) Read(b []byte) (int, error) { return s.read(b, s.readFn) }

// ReadNow reads what the socket holds into b without waiting: 0 and no
// error when it holds nothing.
func (s *Conn) ReadNow(b []byte) (int, error) { return s.read(b, s.readNowFn) }

func (s *Conn) read(b []byte, fn func(fd uintptr) bool) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.r = op{b: b}
	err := s.rc.Read(fn)
	r := s.r
	s.r = op{}
	return s.result("read", r, err)
}

// Write writes all of b, waiting on the poller while the socket is full.
func (s *Conn) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.w = op{b: b}
	err := s.rc.Write(s.writeFn)
	w := s.w
	s.w = op{}
	n, err := s.result("write", w, err)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	return n, err
}

// result is an op's outcome as net's would be.
func (s *Conn) result(verb string, o op, err error) (int, error) {
	switch {
	case err != nil:
		// The poller's: closed, or past the deadline.
		return o.n, &net.OpError{Op: verb, Net: s.net, Addr: s.addr, Err: unwrapOp(err)}
	case o.errno != 0:
		return o.n, &net.OpError{Op: verb, Net: s.net, Addr: s.addr, Err: syscallError(verb, o.errno)}
	case o.eof:
		return 0, io.EOF
	}
	return o.n, nil
}

// syscallError is errno as net's errors carry it.
func syscallError(call string, errno syscall.Errno) error {
	return os.NewSyscallError(call, errno)
}

// unwrapOp is the error under a RawConn's own net.OpError ("raw-read").
func unwrapOp(err error) error {
	if oe, ok := err.(*net.OpError); ok {
		return oe.Err
	}
	return err
}

// readReady is a read that waits on the poller while there is nothing;
// readIfAny one that does not.
func (s *Conn) readReady(fd uintptr) bool { return s.readOnce(fd, false) }
func (s *Conn) readIfAny(fd uintptr) bool { return s.readOnce(fd, true) }

// readOnce reads once, past interruptions; an empty socket makes it
// return onEmpty (true: done, with nothing read).
func (s *Conn) readOnce(fd uintptr, onEmpty bool) bool {
	for {
		n, e := Read(fd, s.r.b)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return onEmpty
		}
		s.r.note(n, e)
		return true
	}
}

// note is a read's outcome: a 0 of a non-empty buffer is the end.
func (o *op) note(n int, e syscall.Errno) {
	switch {
	case e != 0:
		o.errno = e
	case n == 0 && len(o.b) > 0:
		o.eof = true
	default:
		o.n = n
	}
}

func (s *Conn) writeAll(fd uintptr) bool {
	for s.w.n < len(s.w.b) {
		n, e := Write(fd, s.w.b[s.w.n:])
		switch e {
		case 0:
			s.w.n += n
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			s.w.errno = e
			return true
		}
	}
	return true
}

// Read is read(2) on fd as a raw system call.
func Read(fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

// Write is write(2) on fd as a raw system call.
func Write(fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}
