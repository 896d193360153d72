package tlslink

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/hoplink/hoplink/relay/sockio"
)

// recordConn is the TCP connection under a relay's TLS connection. Between
// Hold and Flush it keeps what crypto/tls writes and sends it in one call:
// crypto/tls writes each 16 KiB record on its own, so a 64 KiB write of a
// flow would otherwise cost four system calls and four segments.
type recordConn struct {
	*net.TCPConn
	// io reads and writes the socket in raw system calls (package
	// sockio); nil where there are none.
	io   *sockio.Conn
	mu   sync.Mutex
	hold bool
	buf  *[]byte
	eof  atomic.Bool // a read met the end of the TCP stream
	// lo, once a flow's event loop took the socket over (Takeover), does
	// the reads, writes and closes; the TCPConn is closed by then.
	lo atomic.Pointer[io.ReadWriteCloser]
	// tmu orders Close and Takeover: not mu, which a write blocked on a
	// full socket holds, and which a Close meant to end that write
	// must not wait for.
	tmu    sync.Mutex
	closed bool // under tmu: Close came first, no takeover
}

// Read notes the end of the TCP stream: crypto/tls reports a peer's
// close_notify and a bare TCP end alike as io.EOF, and only the first is
// an end of flow (flow.TLSEnd asks ReadEOF).
func (c *recordConn) Read(b []byte) (int, error) {
	var n int
	var err error
	if lo := c.lo.Load(); lo != nil {
		n, err = (*lo).Read(b)
	} else if c.io != nil {
		n, err = c.io.Read(b)
	} else {
		n, err = c.TCPConn.Read(b)
	}
	if err == io.EOF {
		c.eof.Store(true)
	}
	return n, err
}

// ReadEOF says whether a read met the end of the TCP stream.
func (c *recordConn) ReadEOF() bool { return c.eof.Load() }

var errBusy = errors.New("connection is held or taken over already")

// recordBuf holds one flow write's records: 64 KiB and four record
// overheads, borrowed between Hold and Flush only.
var recordBuf = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10+4*64); return &b }}

func wrap(c net.Conn) net.Conn {
	if tc, ok := c.(*net.TCPConn); ok {
		rc := &recordConn{TCPConn: tc}
		rc.io, _ = sockio.New(tc)
		return rc
	}
	return c
}

// send writes b to the socket.
func (c *recordConn) send(b []byte) (int, error) {
	if lo := c.lo.Load(); lo != nil {
		return (*lo).Write(b)
	}
	if c.io != nil {
		return c.io.Write(b)
	}
	return c.TCPConn.Write(b)
}

// TCP is the connection itself, for socket options and TCP_INFO.
func (c *recordConn) TCP() *net.TCPConn { return c.TCPConn }

func (c *recordConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hold {
		return c.send(b)
	}
	if c.buf == nil {
		c.buf = recordBuf.Get().(*[]byte)
	}
	*c.buf = append(*c.buf, b...)
	return len(b), nil
}

// Close closes the connection, or, once taken over, has its event loop
// reset the flow it carries (relay shutdown closes its active
// connections so).
func (c *recordConn) Close() error {
	c.tmu.Lock()
	lo := c.lo.Load()
	c.closed = lo == nil
	c.tmu.Unlock()
	if lo != nil {
		return (*lo).Close()
	}
	return c.TCPConn.Close()
}

// Takeover hands the socket to an event loop: take is given the socket's
// descriptor and returns the loop's own (a duplicate) and what reads,
// writes and closes it from now on; the TCPConn is then closed, which
// takes the socket out of Go's poller and leaves it to the loop's.
func (c *recordConn) Takeover(take func(fd uintptr) (io.ReadWriteCloser, error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	if c.hold || c.lo.Load() != nil {
		return errBusy
	}
	rc, err := c.TCPConn.SyscallConn()
	if err != nil {
		return err
	}
	var lo io.ReadWriteCloser
	if cerr := rc.Control(func(fd uintptr) { lo, err = take(fd) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	c.lo.Store(&lo)
	c.TCPConn.Close()
	return nil
}

// Hold keeps the writes that follow until Flush.
func (c *recordConn) Hold() {
	c.mu.Lock()
	c.hold = true
	c.mu.Unlock()
}

// Flush sends what was held in one write and stops holding.
func (c *recordConn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = false
	if c.buf == nil {
		return nil
	}
	_, err := c.send(*c.buf)
	*c.buf = (*c.buf)[:0]
	if cap(*c.buf) <= 128<<10 {
		recordBuf.Put(c.buf)
	}
	c.buf = nil
	return err
}

// TCP returns the TCP connection under a relay's TLS connection, or nil.
func TCP(c net.Conn) *net.TCPConn {
	switch x := c.(type) {
	case *net.TCPConn:
		return x
	case *recordConn:
		return x.TCPConn
	}
	return nil
}
