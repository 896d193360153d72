package relay

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/relay/hop"
)

// copyBufSize is the buffer a flow borrows while bytes are moving. Flows
// borrow it from a pool only once data is ready to read and give it back as
// soon as the source is drained, so an idle flow holds no buffer at all:
// that is what keeps ten thousand open flows cheap.
const copyBufSize = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// tlsBufPool serves TLS sources, which hold their buffer while idle; a TLS
// read returns at most one 16 KiB record anyway.
var tlsBufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// end is one side of a flow: a TCP connection or a QUIC stream.
type end interface {
	io.Writer
	Read([]byte) (int, error)
	// wait blocks until a Read would not block, without holding a buffer.
	wait() error
	// closeWrite sends EOF, keeping the other direction open (half-close).
	closeWrite() error
	// abort resets both directions, so the reset reaches the far end.
	abort()
	// fail resets with a reason the previous hop can read (QUIC only).
	fail(code quicgo.StreamErrorCode)
	// close releases the end after both directions finished cleanly.
	close()
}

type tcpEnd struct {
	c   *net.TCPConn
	rc  syscall.RawConn
	one [1]byte
}

func newTCPEnd(c *net.TCPConn) (*tcpEnd, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &tcpEnd{c: c, rc: rc}, nil
}

func (t *tcpEnd) Read(b []byte) (int, error)  { return t.c.Read(b) }
func (t *tcpEnd) Write(b []byte) (int, error) { return t.c.Write(b) }
func (t *tcpEnd) closeWrite() error           { return t.c.CloseWrite() }
func (t *tcpEnd) close()                      { t.c.Close() }

func (t *tcpEnd) abort() {
	t.c.SetLinger(0) // close with RST, not FIN
	t.c.Close()
}

func (t *tcpEnd) fail(quicgo.StreamErrorCode) { t.abort() }

// wait parks on the poller until the socket has data, EOF or an error. It
// peeks rather than trusting readiness edges, which a previous read may have
// consumed. A pending socket error (a reset) is reported by the peek and
// cleared by the kernel, so wait must return it: the next read would see a
// clean EOF and turn a reset into a graceful close.
func (t *tcpEnd) wait() error {
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

type streamEnd struct {
	s   *quicgo.Stream
	one [1]byte
	// code is sent when the flow is aborted from this relay.
	code quicgo.StreamErrorCode
}

func newStreamEnd(s *quicgo.Stream) *streamEnd {
	return &streamEnd{s: s, code: hop.CodeReset}
}

func (e *streamEnd) Read(b []byte) (int, error)  { return e.s.Read(b) }
func (e *streamEnd) Write(b []byte) (int, error) { return e.s.Write(b) }
func (e *streamEnd) closeWrite() error           { return e.s.Close() }
func (e *streamEnd) close()                      {}

func (e *streamEnd) abort() { e.fail(e.code) }

func (e *streamEnd) fail(code quicgo.StreamErrorCode) {
	e.s.CancelRead(code)
	e.s.CancelWrite(code)
}

// tlsEnd is a flow's TLS connection to or from a peer relay.
type tlsEnd struct {
	c    *tls.Conn
	done func() // tells the TLS endpoint the connection is finished
	once sync.Once
}

func (t *tlsEnd) Read(b []byte) (int, error)  { return t.c.Read(b) }
func (t *tlsEnd) Write(b []byte) (int, error) { return t.c.Write(b) }

// closeWrite sends TLS close_notify: the peer reads EOF, and can still send.
func (t *tlsEnd) closeWrite() error { return t.c.CloseWrite() }

// wait cannot tell whether crypto/tls holds decrypted or undecrypted
// records, so a TLS source reads straight away and holds a (small) buffer
// while idle; TLS is the bulk transport.
func (t *tlsEnd) wait() error { return nil }

func (t *tlsEnd) close() {
	t.c.Close()
	t.once.Do(t.done)
}

func (t *tlsEnd) abort() {
	if tc, ok := t.c.NetConn().(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	t.c.NetConn().Close()
	t.once.Do(t.done)
}

func (t *tlsEnd) fail(quicgo.StreamErrorCode) { t.abort() }

func (e *streamEnd) wait() error {
	_, err := e.s.Peek(e.one[:])
	return err
}

// pipe moves bytes both ways between a (toward the client) and b (toward
// the target) until both directions end. EOF in one direction half-closes
// the other end; an error anywhere resets both ends, so a reset travels the
// whole chain. Backpressure is natural: a side that cannot write stops its
// reader, and QUIC flow control stops the sender upstream.
func pipe(a, b end, up, down prometheus.Counter) error {
	done := make(chan error, 1)
	go func() {
		err := copyHalf(b, a, up)
		if err != nil {
			a.abort()
			b.abort()
		}
		done <- err
	}()
	err := copyHalf(a, b, down)
	if err != nil {
		a.abort()
		b.abort()
	}
	err = errors.Join(err, <-done)
	if err == nil {
		a.close()
		b.close()
	}
	return err
}

func copyHalf(dst, src end, n prometheus.Counter) error {
	for {
		if err := src.wait(); err != nil && err != io.EOF {
			return err
		}
		pool := &bufPool
		if _, ok := src.(*tlsEnd); ok {
			pool = &tlsBufPool
		}
		bp := pool.Get().(*[]byte)
		buf := *bp
		for {
			nr, rerr := src.Read(buf)
			if nr > 0 {
				if _, werr := dst.Write(buf[:nr]); werr != nil {
					pool.Put(bp)
					return werr
				}
				n.Add(float64(nr))
			}
			if rerr == io.EOF {
				pool.Put(bp)
				return dst.closeWrite()
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

// spliceTCP joins two TCP connections directly, as a plain port forward
// does. io.CopyN between *net.TCPConn uses splice(2) on Linux.
func spliceTCP(a, b *net.TCPConn, up, down prometheus.Counter) error {
	half := func(dst, src *net.TCPConn, n prometheus.Counter) error {
		for {
			w, err := io.CopyN(dst, src, spliceChunk)
			n.Add(float64(w))
			if err == io.EOF {
				return dst.CloseWrite()
			}
			if err != nil {
				return err
			}
		}
	}
	ta, tb := &tcpEnd{c: a}, &tcpEnd{c: b}
	done := make(chan error, 1)
	go func() {
		err := half(b, a, up)
		if err != nil {
			ta.abort()
			tb.abort()
		}
		done <- err
	}()
	err := half(a, b, down)
	if err != nil {
		ta.abort()
		tb.abort()
	}
	err = errors.Join(err, <-done)
	a.Close()
	b.Close()
	return err
}
