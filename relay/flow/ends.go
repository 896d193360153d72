// Package flow moves one flow's bytes between its two ends: a TCP socket,
// a QUIC stream, a TLS connection to a peer relay, or a connection of a tun
// Tunnel's stack. Both directions are copied independently; EOF in one
// half-closes the far end, and an error resets both ends, so a reset
// travels the whole chain.
package flow

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/sockio"
)

// End is one side of a flow.
type End interface {
	io.Writer
	Read([]byte) (int, error)
	// Wait blocks until a Read would not block, without holding a buffer.
	Wait() error
	// CloseWrite sends EOF, keeping the other direction open (half-close).
	CloseWrite() error
	// Abort resets both directions, so the reset reaches the far end.
	Abort()
	// Fail resets with a reason the previous hop can read (QUIC only).
	Fail(code hop.Code)
	// Close releases the end after both directions finished cleanly.
	Close()
}

// ErrCut is a hop's TLS connection that ended without TLS close_notify:
// its peer relay died, or something between the relays closed the TCP
// connection. The sender never said it was done, so the flow is aborted,
// never ended cleanly with what arrived so far.
var ErrCut = errors.New("hop connection ended without an end of flow (no TLS close_notify)")

// breakable is an End that can tell, without reading it, whether its peer
// reset it. A half that is stuck writing reads nothing, so only this shows
// it a reset of the end it copies from (Join's stall watch).
type breakable interface {
	Broken() bool
}

// TCPEnd is a flow's TCP connection: a Tunnel's client, or a target.
type TCPEnd struct {
	c   *net.TCPConn
	rc  syscall.RawConn
	io  *sockio.Conn // nil where raw system calls are not to be had
	one [1]byte
	rd  tcpRead

	// Once an event loop carries the flow (loopJoin), lo is its end
	// there: Abort resets the flow through the loop. mu orders the
	// takeover and an Abort.
	mu      sync.Mutex
	lo      *lend
	aborted bool

	// finSent: this end's writes were closed cleanly. reset: Broken found
	// the peer reset, taking the error off the socket. Both say whether
	// an end of stream read later was a reset (cutEOF).
	finSent, reset atomic.Bool
}

// tcpRead is the state of ReadWhenReady and ReadReady, which only the
// half that copies from the end calls: their readiness callbacks are made
// once, since a closure made per read escapes to the heap, several
// allocations per message.
type tcpRead struct {
	pool           *sync.Pool
	bp             *[]byte
	b              []byte
	n              int
	err            error
	whenReady, now func(fd uintptr) bool
}

// TCP makes c an End. While the flow is open, closing c resets it: should
// the relay process die, the kernel closes its sockets, and the client or
// target must see a reset, never a clean end of a stream cut short.
func TCP(c *net.TCPConn) (*TCPEnd, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	armReset(c)
	t := &TCPEnd{c: c, rc: rc}
	t.io, _ = sockio.New(c)
	t.rd.whenReady, t.rd.now = t.readWhenReady, t.readNow
	return t, nil
}

// armReset makes closing c send RST (SO_LINGER 0). A clean half-close
// (CloseWrite) disarms it, so the FIN then follows every byte written.
func armReset(c *net.TCPConn) { c.SetLinger(0) }

// Conn is the connection, for splicing.
func (t *TCPEnd) Conn() *net.TCPConn { return t.c }

// Read and Write make raw system calls where they can (package sockio):
// the socket is non-blocking, so the scheduler need not hear of them.
func (t *TCPEnd) Read(b []byte) (int, error) {
	if t.io != nil {
		return t.io.Read(b)
	}
	return t.c.Read(b)
}

func (t *TCPEnd) Write(b []byte) (int, error) {
	if t.io != nil {
		return t.io.Write(b)
	}
	return t.c.Write(b)
}

func (t *TCPEnd) CloseWrite() error {
	t.finSent.Store(true)
	return closeWrite(t.c)
}
func (t *TCPEnd) Close()        { t.c.Close() }
func (t *TCPEnd) Fail(hop.Code) { t.Abort() }

// Broken says whether the peer reset the connection (or TCP gave up on
// it). Asking takes the reset's error off the socket, so the answer is
// kept for cutEOF.
func (t *TCPEnd) Broken() bool {
	if t.reset.Load() {
		return true
	}
	if wasReset(t.c) {
		t.reset.Store(true)
		return true
	}
	return false
}

// cutEOF says whether an end of stream just read was a reset whose error
// something took off the socket first: Broken, or a write of the other
// direction (a failed send takes it too), which may have aborted the end
// since. A socket reaches CLOSE cleanly only after this end sent its FIN;
// in CLOSE before that, it was reset.
func (t *TCPEnd) cutEOF() bool {
	t.mu.Lock()
	aborted := t.aborted
	t.mu.Unlock()
	return aborted || t.reset.Load() || !t.finSent.Load() && inClose(t.c)
}

// cutTeller is a source that can tell a clean end of stream from a reset
// read as one.
type cutTeller interface {
	cutEOF() bool
}

// closeWrite ends c's sending direction cleanly: the reset armed for a
// crash is lifted first, so bytes still queued go out before the FIN.
func closeWrite(c *net.TCPConn) error {
	c.SetLinger(-1)
	return c.CloseWrite()
}

// Abort closes with RST, not FIN.
func (t *TCPEnd) Abort() {
	t.mu.Lock()
	lo := t.lo
	t.aborted = true
	t.mu.Unlock()
	if lo != nil {
		lo.Close()
		return
	}
	t.c.SetLinger(0)
	t.c.Close()
}

// Wait parks on the poller until the socket has data, EOF or an error. It
// peeks rather than trusting readiness edges, which a previous read may have
// consumed. A pending socket error (a reset) is reported by the peek and
// cleared by the kernel, so Wait must return it: the next read would see a
// clean EOF and turn a reset into a graceful close.
func (t *TCPEnd) Wait() error {
	var perr error
	err := t.rc.Read(func(fd uintptr) bool {
		_, _, e := unix.Recvfrom(int(fd), t.one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if e == unix.EAGAIN || e == unix.EINTR {
			return false
		}
		perr = e
		return true
	})
	if err != nil {
		return err
	}
	if perr != nil {
		return os.NewSyscallError("recvfrom", perr)
	}
	return nil
}

// readyReader is a source that can wait for data and read it in one go,
// taking a buffer only once there is something to read: a TCP socket,
// where Wait and then Read cost a peek and a read, a system call more per
// message than a request/response flow needs.
type readyReader interface {
	// ReadWhenReady parks until the source has data, EOF or an error,
	// then reads into a buffer from pool. The buffer (nil with n 0 and an
	// error when none was taken) is the caller's to give back.
	ReadWhenReady(pool *sync.Pool) (bp *[]byte, n int, err error)
}

// ReadWhenReady reads from the socket as soon as it is readable. The
// buffer is taken only inside the readiness callback and given back when
// the read would block, so a parked flow holds none. A reset comes back
// as the read's error, as from Wait's peek.
func (t *TCPEnd) ReadWhenReady(pool *sync.Pool) (*[]byte, int, error) {
	if t.rc == nil {
		// No raw socket (not made by TCP): a plain read, holding the
		// buffer while it waits.
		b := pool.Get().(*[]byte)
		n, err := t.c.Read(*b)
		return b, n, err
	}
	r := &t.rd
	r.pool, r.bp, r.n, r.err = pool, nil, 0, nil
	if err := t.rc.Read(r.whenReady); err != nil {
		if r.bp != nil {
			pool.Put(r.bp)
		}
		return nil, 0, err
	}
	bp := r.bp
	r.pool, r.bp = nil, nil
	return bp, r.n, r.err
}

func (t *TCPEnd) readWhenReady(fd uintptr) bool {
	r := &t.rd
	b := r.pool.Get().(*[]byte)
	m, e := sockio.Read(fd, *b)
	for e == unix.EINTR {
		m, e = sockio.Read(fd, *b)
	}
	if e == unix.EAGAIN {
		r.pool.Put(b)
		return false
	}
	r.bp = b
	r.n, r.err = readResult(m, e)
	return true
}

// readResult is a read(2)'s outcome as io.Reader's: a 0 is the end.
func readResult(n int, e syscall.Errno) (int, error) {
	switch {
	case e != 0:
		return 0, os.NewSyscallError("read", e)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// ReadReady reads what the socket holds now into b, without waiting: the
// rest of a burst whose start filled a small buffer, so that bulk leaves
// in writes as large as before.
func (t *TCPEnd) ReadReady(b []byte) (int, error) {
	if t.rc == nil {
		return 0, nil
	}
	r := &t.rd
	r.b, r.n, r.err = b, 0, nil
	err := t.rc.Read(r.now)
	r.b = nil
	if err != nil {
		return 0, err
	}
	return r.n, r.err
}

func (t *TCPEnd) readNow(fd uintptr) bool {
	r := &t.rd
	for {
		m, e := sockio.Read(fd, r.b)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return true // nothing more now
		}
		r.n, r.err = readResult(m, e)
		return true
	}
}

// StreamEnd is a flow's QUIC stream to or from a peer relay.
type StreamEnd struct {
	s       *quicgo.Stream
	one     [1]byte
	release func()      // may run more than once
	fin     atomic.Bool // this side ended its writes cleanly
	// win is the Window of the stream's connection, nil when the stream
	// is not a TCP flow's. sent counts the first bytes written (the
	// writing half's alone), settled says they are all out.
	win     *Window
	sent    int
	settled atomic.Bool
}

// Stream makes s an End.
func Stream(s *quicgo.Stream) *StreamEnd { return &StreamEnd{s: s, release: func() {}} }

// HeldStream is Stream for a TCP flow on connection c, calling release
// (when not nil) when the flow ends (Close or Fail): its connection stays
// until then when its peer drains. Its first writes wait for c's window
// no longer than a stalled flow of c takes to be reset (Window).
func HeldStream(c *quicgo.Conn, s *quicgo.Stream, release func()) *StreamEnd {
	if release == nil {
		release = func() {}
	}
	return &StreamEnd{s: s, release: release, win: WindowOf(c)}
}

func (e *StreamEnd) Read(b []byte) (int, error) { return e.s.Read(b) }

func (e *StreamEnd) Write(b []byte) (int, error) {
	if e.win == nil || e.settled.Load() {
		return e.s.Write(b)
	}
	n, err := e.win.write(e.s, b)
	if e.sent += n; e.sent >= firstBytes {
		e.settled.Store(true)
	}
	return n, err
}

// SetDeadline bounds the reads and writes that follow.
func (e *StreamEnd) SetDeadline(d time.Time) error { return e.s.SetDeadline(d) }

func (e *StreamEnd) CloseWrite() error { e.fin.Store(true); return e.s.Close() }
func (e *StreamEnd) Close()            { e.release() }
func (e *StreamEnd) Abort()            { e.Fail(hop.CodeReset) }
func (e *StreamEnd) Fail(code hop.Code) {
	Reset(e.s, code)
	e.release()
}

// Broken says whether the peer reset the stream or the connection died:
// the stream's context ends then, and also when this side ended its writes
// cleanly, which is no reset. A reset of the receive side alone, once this
// side has sent its FIN, shows only to a read.
func (e *StreamEnd) Broken() bool {
	select {
	case <-e.s.Context().Done():
		return !e.fin.Load()
	default:
		return false
	}
}

// Wait peeks, which quic-go does without a buffer of ours.
func (e *StreamEnd) Wait() error {
	_, err := e.s.Peek(e.one[:])
	return err
}

// ResetCode says whether err is a hop's reset, and its code: sent by the
// relay beside this one (remote), or by this relay's own Reset or Fail.
func ResetCode(err error) (code hop.Code, remote, ok bool) {
	var se *quicgo.StreamError
	if !errors.As(err, &se) {
		return 0, false, false
	}
	return hop.Code(se.ErrorCode), se.Remote, true
}

// Reset ends both directions of a stream with code, which the peer reads.
func Reset(s *quicgo.Stream, code hop.Code) {
	s.CancelRead(quicgo.StreamErrorCode(code))
	s.CancelWrite(quicgo.StreamErrorCode(code))
}

// TLSEnd is a flow's TLS connection to or from a peer relay.
type TLSEnd struct {
	c    *tls.Conn
	rc   syscall.RawConn // the TCP socket under c; nil when it is none
	rh   recordHolder    // nil when the connection under c sends records one by one
	eof  eofTeller       // nil when the connection under c cannot say
	done func()          // tells the TLS endpoint the connection is finished
	once sync.Once
	// segs is the kernel's count of segments sent and retransmitted,
	// read as the connection closes: what it saw of the link's loss.
	segs [2]uint32
	// lo is the end on an event loop once one carries the flow: the
	// socket is the loop's then, not the TCP connection's under c.
	lo atomic.Pointer[lend]
}

// Segments returns the TCP segments the connection sent and retransmitted
// (TCP_INFO), once it closed; zeros where the kernel does not say.
func (t *TLSEnd) Segments() (sent, retransmitted uint32) { return t.segs[0], t.segs[1] }

// SegmentsSoFar returns the TCP segments the open connection sent and
// retransmitted until now (TCP_INFO), wherever its socket is; zeros once
// it closed, or where the kernel does not say.
func (t *TLSEnd) SegmentsSoFar() (sent, retransmitted uint32) {
	if lo := t.lo.Load(); lo != nil {
		return lo.segments()
	}
	if tc := tcpOf(t.c); tc != nil {
		return segments(tc)
	}
	return 0, 0
}

func (t *TLSEnd) finish() {
	t.segs[0], t.segs[1] = t.SegmentsSoFar()
	t.done()
}

// TLS makes c an End; done runs once, when it is closed or aborted.
func TLS(c *tls.Conn, done func()) *TLSEnd {
	t := &TLSEnd{c: c, done: done}
	if tc := tcpOf(c); tc != nil {
		t.rc, _ = tc.SyscallConn()
	}
	t.rh, _ = c.NetConn().(recordHolder)
	t.eof, _ = c.NetConn().(eofTeller)
	return t
}

// eofTeller is a connection under TLS that says whether a read of it met
// the TCP end (relay/tlslink's). crypto/tls returns io.EOF both for the
// peer's close_notify and for a TCP FIN without one; only the first ends a
// flow. crypto/tls handles a close_notify before it reads on, so a TCP end
// was read only when none came.
type eofTeller interface {
	ReadEOF() bool
}

// recordHolder is a connection under TLS that can hold the records of one
// Write and send them together (relay/tlslink's).
type recordHolder interface {
	Hold()
	Flush() error
}

// tcpOf is the TCP connection under c, or nil.
func tcpOf(c *tls.Conn) *net.TCPConn {
	switch x := c.NetConn().(type) {
	case *net.TCPConn:
		return x
	case interface{ TCP() *net.TCPConn }:
		return x.TCP()
	}
	return nil
}

// Write sends b's records in one system call where the connection allows.
func (t *TLSEnd) Write(b []byte) (int, error) {
	if t.rh == nil {
		return t.c.Write(b)
	}
	t.rh.Hold()
	n, err := t.c.Write(b)
	if ferr := t.rh.Flush(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}

// Read returns at most one TLS record. The end of the stream is io.EOF
// only after the peer's close_notify; a connection that just ended is
// ErrCut.
func (t *TLSEnd) Read(b []byte) (int, error) {
	n, err := t.c.Read(b)
	if err == io.EOF && t.eof != nil && t.eof.ReadEOF() {
		err = ErrCut
	}
	return n, err
}

// maxRecord is the most plaintext one TLS record carries.
const maxRecord = 16 << 10

// ReadReady reads further records into b while the socket holds more bytes
// and b has room for a whole record. crypto/tls returns one record per
// Read, so without this a bulk flow would leave in 16 KiB writes: four
// times the system calls and segments for whoever it writes to. It may
// wait for the rest of a record whose start already arrived, which a
// sender that writes whole records delivers at once.
func (t *TLSEnd) ReadReady(b []byte) (int, error) {
	n := 0
	for len(b)-n >= maxRecord && t.buffered() {
		m, err := t.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// buffered says whether the socket has bytes not yet read (SIOCINQ).
func (t *TLSEnd) buffered() bool {
	if t.rc == nil {
		return false
	}
	v := 0
	if err := t.rc.Control(func(fd uintptr) { v, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return false
	}
	return v > 0
}

func (t *TLSEnd) Fail(hop.Code) { t.Abort() }

// Broken says whether the peer reset the TCP connection under c.
func (t *TLSEnd) Broken() bool {
	tc := tcpOf(t.c)
	return tc != nil && wasReset(tc)
}

// TCP is the TCP connection under the TLS connection, or nil.
func (t *TLSEnd) TCP() *net.TCPConn { return tcpOf(t.c) }

// CloseWrite sends TLS close_notify: the peer reads EOF, and can still send.
func (t *TLSEnd) CloseWrite() error { return t.c.CloseWrite() }

// Wait cannot tell whether crypto/tls holds decrypted or undecrypted
// records, so a TLS source reads straight away and holds a (small) buffer
// while idle; TLS is the bulk transport.
func (t *TLSEnd) Wait() error { return nil }

// SetReadDeadline bounds the reads that follow.
func (t *TLSEnd) SetReadDeadline(d time.Time) error { return t.c.SetReadDeadline(d) }

// SetDeadline bounds the reads and writes that follow.
func (t *TLSEnd) SetDeadline(d time.Time) error { return t.c.SetDeadline(d) }

// SetWriteDeadline bounds the writes that follow; one that times out
// leaves the connection unusable (crypto/tls), so its flow must end.
func (t *TLSEnd) SetWriteDeadline(d time.Time) error { return t.c.SetWriteDeadline(d) }

func (t *TLSEnd) Close() {
	t.once.Do(t.finish)
	t.c.Close()
}

func (t *TLSEnd) Abort() {
	t.once.Do(t.finish)
	if tc := tcpOf(t.c); tc != nil {
		tc.SetLinger(0)
	}
	t.c.NetConn().Close()
}
