package flow

import (
	"errors"
	"io"
	"net"
	"sync"
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

// Join moves bytes both ways between a (toward the client) and b (toward
// the target) until both directions end, counting up (a to b) and down.
// EOF in one direction half-closes the other end; an error anywhere resets
// both ends. Backpressure is natural: a side that cannot write stops its
// reader, and QUIC flow control stops the sender upstream.
func Join(a, b End, up, down Counter) error {
	done := make(chan error, 1)
	go func() {
		err := copyHalf(b, a, up)
		if err != nil {
			a.Abort()
			b.Abort()
		}
		done <- err
	}()
	err := copyHalf(a, b, down)
	if err != nil {
		a.Abort()
		b.Abort()
	}
	err = errors.Join(err, <-done)
	if err == nil {
		a.Close()
		b.Close()
	}
	return err
}

func copyHalf(dst, src End, n Counter) error {
	pool := &bufPool
	if _, ok := src.(*TLSEnd); ok {
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
			if nr > 0 {
				if _, werr := dst.Write(buf[:nr]); werr != nil {
					pool.Put(bp)
					return werr
				}
				n.Add(float64(nr))
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
// does: io.CopyN between *net.TCPConn uses splice(2) on Linux.
func Splice(a, b *net.TCPConn, up, down Counter) error {
	half := func(dst, src *net.TCPConn, n Counter) error {
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
	ta, tb := &TCPEnd{c: a}, &TCPEnd{c: b}
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
	err = errors.Join(err, <-done)
	a.Close()
	b.Close()
	return err
}
