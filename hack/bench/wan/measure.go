//go:build linux

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

type echoResult struct {
	first, total, p99 time.Duration
	done              int // echoes answered
	cc                string
	err               error
}

// echoShape runs seed 002's client: connect, then n sequential echoes of
// size bytes on the one connection, all within timeout. first is the
// connect and the first echo; p99 is of the echoes' round trips, by
// nearest rank.
func echoShape(dial func(string) (net.Conn, error), addr string, n, size int, timeout time.Duration) (r echoResult) {
	start := time.Now()
	c, err := dial(addr)
	if err != nil {
		r.err = err
		return r
	}
	defer c.Close()
	r.cc = congestion(c)
	c.SetDeadline(start.Add(timeout))
	msg := bytes.Repeat([]byte{'x'}, size)
	buf := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	for i := range n {
		t := time.Now()
		if _, err := c.Write(msg); err != nil {
			r.err = err
			return r
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			r.err = fmt.Errorf("echo %d of %d: %w", i+1, n, err)
			return r
		}
		rtts = append(rtts, time.Since(t))
		r.done++
		if i == 0 {
			r.first = time.Since(start)
		}
	}
	r.total = time.Since(start)
	slices.Sort(rtts)
	r.p99 = rtts[int(math.Ceil(0.99*float64(len(rtts))))-1]
	return r
}

// congestion is the TCP congestion control of the client's socket (the
// host's default, unless something set another).
func congestion(c net.Conn) string {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return ""
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return ""
	}
	var cc string
	raw.Control(func(fd uintptr) { cc, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	return cc
}

// bulk opens streams connections to addr and sends on each for d from the
// start (the connects included). Its goodput is what the target received
// within those d, however much the path still held when they ended; then
// both ends reset, so a slow path's backlog does not stretch the run.
func bulk(dial func(string) (net.Conn, error), addr string, streams int, d time.Duration, sink *sinkServer) (mbps float64, err error) {
	start := time.Now()
	end := start.Add(d)
	ids := make([]uint64, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i := range streams {
		ids[i] = rand.Uint64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dial(addr)
			if err != nil {
				errs[i] = err
				return
			}
			defer abort(c)
			c.SetWriteDeadline(end)
			buf := make([]byte, 64<<10)
			binary.BigEndian.PutUint64(buf, ids[i])
			for {
				if _, err := c.Write(buf); err != nil {
					if !isTimeout(err) {
						errs[i] = err
					}
					return
				}
				clear(buf[:8])
			}
		}()
	}
	time.Sleep(time.Until(end))
	var got int64
	for _, id := range ids {
		got += sink.received(id)
	}
	wg.Wait() // each sender's write times out at end, and it resets
	for _, id := range ids {
		sink.abort(id)
	}
	return float64(got) * 8 / d.Seconds() / 1e6, errors.Join(errs...)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// abort closes a connection with a reset, discarding what it still holds.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// sinkServer counts what each bulk connection delivered; a connection
// names itself in its first 8 bytes.
type sinkServer struct {
	mu    sync.Mutex
	conns map[uint64]*sinkConn
}

type sinkConn struct {
	n    atomic.Int64 // bytes after the name
	mu   sync.Mutex
	c    net.Conn
	gone bool
}

func newSinkServer() *sinkServer { return &sinkServer{conns: map[uint64]*sinkConn{}} }

func (s *sinkServer) get(id uint64) *sinkConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := s.conns[id]
	if sc == nil {
		sc = &sinkConn{}
		s.conns[id] = sc
	}
	return sc
}

func (s *sinkServer) serve(c net.Conn) {
	defer c.Close()
	var name [8]byte
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(c, name[:]); err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	sc := s.get(binary.BigEndian.Uint64(name[:]))
	sc.mu.Lock()
	if sc.gone {
		sc.mu.Unlock()
		abort(c)
		return
	}
	sc.c = c
	sc.mu.Unlock()
	buf := make([]byte, 256<<10)
	for {
		n, err := c.Read(buf)
		sc.n.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// received is what connection id delivered so far.
func (s *sinkServer) received(id uint64) int64 { return s.get(id).n.Load() }

// abort resets connection id at the target, or refuses it should it arrive
// late.
func (s *sinkServer) abort(id uint64) {
	sc := s.get(id)
	sc.mu.Lock()
	sc.gone = true
	if sc.c != nil {
		abort(sc.c)
	}
	sc.mu.Unlock()
}

func (s *sinkServer) closeAll() {
	s.mu.Lock()
	ids := make([]uint64, 0, len(s.conns))
	for id := range s.conns {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.abort(id)
	}
}
