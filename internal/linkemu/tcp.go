package linkemu

import (
	"net"
	"sync"
	"time"
)

// TCPProxy forwards each connection to one target, delaying (and rate
// limiting) the bytes in each direction. Loss does not apply: TCP would
// retransmit, and a user-space proxy only sees the stream.
type TCPProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	up, down Params
	shapers  []*shaper // of live connections, to change them with Set
}

// NewTCPProxy listens on listen and forwards to target.
func NewTCPProxy(listen, target string, p Params) (*TCPProxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	t := &TCPProxy{ln: ln, target: target, up: p, down: p}
	go t.serve()
	return t, nil
}

// Addr is where clients connect.
func (t *TCPProxy) Addr() string { return t.ln.Addr().String() }

// Set changes both directions of every connection, open or future.
func (t *TCPProxy) Set(p Params) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.up, t.down = p, p
	p.Loss, p.Queue = 0, 0
	for _, s := range t.shapers {
		s.set(p)
	}
}

// Close stops accepting; open connections end when their peers close.
func (t *TCPProxy) Close() error { return t.ln.Close() }

func (t *TCPProxy) serve() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		go t.handle(c.(*net.TCPConn))
	}
}

func (t *TCPProxy) handle(c *net.TCPConn) {
	defer c.Close()
	tc, err := net.Dial("tcp", t.target)
	if err != nil {
		return
	}
	defer tc.Close()
	t.mu.Lock()
	upP, downP := t.up, t.down
	upP.Loss, downP.Loss = 0, 0
	upP.Queue, downP.Queue = 0, 0 // a stream has no packets to drop
	up, down := newShaper(upP), newShaper(downP)
	t.shapers = append(t.shapers, up, down)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.shapers = slicesDelete(t.shapers, up, down)
		t.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	go func() { shapeCopy(tc.(*net.TCPConn), c, up); done <- struct{}{} }()
	go func() { shapeCopy(c, tc.(*net.TCPConn), down); done <- struct{}{} }()
	<-done
	<-done
}

// shapeCopy copies src to dst, each chunk leaving at its shaped time, and
// passes the half-close on after the last chunk.
func shapeCopy(dst, src *net.TCPConn, s *shaper) {
	p := &pipe{s: s, q: make(chan packet, maxQueue), done: make(chan struct{})}
	var werr error
	p.send = func(b []byte) {
		if werr == nil {
			_, werr = dst.Write(b)
		}
	}
	finished := make(chan struct{})
	go func() { p.run(); close(finished) }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			at, late, _ := s.departure(time.Now(), n)                // Loss and Queue are zero for TCP shapers
			p.q <- packet{append([]byte(nil), buf[:n]...), at, late} // blocks when full: backpressure
		}
		if err != nil {
			break
		}
	}
	close(p.q)
	<-finished
	if werr == nil {
		dst.CloseWrite()
	} else {
		src.CloseRead()
	}
}

func slicesDelete(list []*shaper, drop ...*shaper) []*shaper {
	out := list[:0]
	for _, s := range list {
		if s != drop[0] && s != drop[1] {
			out = append(out, s)
		}
	}
	return out
}
