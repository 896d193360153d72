package faults

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPatternDependsOnOffsetAlone: filled in pieces at odd offsets it is the
// same stream, and a run of bytes lost or repeated does not match.
func TestPatternDependsOnOffsetAlone(t *testing.T) {
	whole := make([]byte, 1000)
	pattern(whole, 0)
	pieces := make([]byte, 0, len(whole))
	for off, n := 0, 1; off < len(whole); off, n = off+n, n%13+1 {
		n = min(n, len(whole)-off)
		b := make([]byte, n)
		pattern(b, int64(off))
		pieces = append(pieces, b...)
	}
	if !bytes.Equal(whole, pieces) {
		t.Fatal("the pattern filled in pieces differs from the pattern filled at once")
	}
	for _, shift := range []int{1, 7, 8, 64} {
		at := make([]byte, 100)
		pattern(at, 500)
		if bytes.Equal(at, whole[500+shift:600+shift]) || bytes.Equal(at, whole[500-shift:600-shift]) {
			t.Errorf("a run shifted by %d bytes matches the pattern", shift)
		}
	}
}

// TestAppTellsAResetFromAnEndOfStream: a reset reported beside an end of
// stream is the end; a broken pipe after one (the peer closed, then reset
// what came after) leaves it clean.
func TestAppTellsAResetFromAnEndOfStream(t *testing.T) {
	op := func(errno syscall.Errno) error {
		return &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", errno)}
	}
	for _, tc := range []struct {
		name    string
		then    error
		how     How
		hasThen bool
	}{
		{"a reset beside it", op(syscall.ECONNRESET), Reset, false},
		{"a broken pipe after it", op(syscall.EPIPE), Clean, true},
	} {
		var a app
		a.readEnd(io.EOF)
		a.saw(Reset, fmt.Errorf("write: %w", tc.then))
		e := a.end(time.Now())
		if e.How != tc.how || (e.Then != "") != tc.hasThen {
			t.Errorf("%s: %+v, want %s", tc.name, e, tc.how)
		}
	}
	var a app
	a.saw(Reset, op(syscall.ECONNRESET))
	a.readEnd(io.EOF)
	if e := a.end(time.Now()); e.How != Reset || e.Then != "" {
		t.Errorf("an end of stream after a reset: %+v, want the reset alone", e)
	}
}

func TestVerdict(t *testing.T) {
	c := Case{Size: 100}
	reset := func(after time.Duration) End { return End{How: Reset, After: after} }
	clean := func(after time.Duration) End { return End{How: Clean, After: after} }
	for _, tc := range []struct {
		name string
		r    Result
		want string
	}{
		{"both reset at once", Result{Case: c, Client: reset(0), Target: reset(time.Second), Received: 40}, OK},
		{"both reset, one slowly", Result{Case: c, Client: reset(time.Second), Target: reset(11 * time.Second), Received: 40}, Slow},
		{"a clean end, short", Result{Case: c, Client: clean(0), Target: reset(0), Received: 40}, Truncated},
		{"a clean end, short, and a hang", Result{Case: c, Client: clean(0), Target: End{How: None}, Received: 40}, Truncated},
		{"a hang", Result{Case: c, Client: reset(0), Target: End{How: None}, Received: 40}, Hung},
		{"a byte differs", Result{Case: c, Client: clean(0), Target: clean(0), Received: 40, Differs: true}, Corrupt},
		{"an end before the kill", Result{Case: c, Client: reset(-time.Second), Target: reset(0), Received: 40}, Early},
		{"the transfer completed", Result{Case: c, Client: clean(0), Target: clean(0), Received: 100}, Missed},
	} {
		if got := tc.r.Verdict(); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// proxy stands where the relays stand, so the instrument can be checked
// against ends whose every move is known: it forwards each connection to
// target until killed, then does what mode says.
type proxy struct {
	ln      net.Listener
	target  string
	mode    string // "reset": both sockets reset; "fin": both half-closed; "hang": nothing more
	corrupt bool   // flip a byte in each direction
	mu      sync.Mutex
	conns   []*net.TCPConn
}

func startProxy(t *testing.T, target, mode string, corrupt bool) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, mode: mode, corrupt: corrupt}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, a.(*net.TCPConn), b.(*net.TCPConn))
			p.mu.Unlock()
			go p.copy(b, a)
			go p.copy(a, b)
		}
	}()
	return p
}

// copy forwards until an error, and then leaves both sockets as they are:
// what the peers see at the kill is the kill's doing alone.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	var n int64
	const flip = 100_000 // past the tag
	for {
		k, err := src.Read(buf)
		if p.corrupt && n <= flip && flip < n+int64(k) {
			buf[flip-n] ^= 1
		}
		n += int64(k)
		if _, werr := dst.Write(buf[:k]); werr != nil || err != nil {
			return
		}
	}
}

func (p *proxy) kill() error {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.SetDeadline(time.Unix(1, 0)) // stop the copies
	}
	for _, c := range p.conns {
		switch p.mode {
		case "reset":
			c.SetLinger(0)
			c.Close()
		case "fin":
			c.CloseWrite()
		}
	}
	return nil
}

// TestTransferSeesHowTheProxyEnds: the instrument calls a reset ok, a
// clean half-close TRUNCATED, silence HUNG and a flipped byte CORRUPT, in
// both directions.
func TestTransferSeesHowTheProxyEnds(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		corrupt bool
		want    string
		how     How
	}{
		{"reset", false, OK, Reset},
		{"fin", false, Truncated, Clean},
		{"hang", false, Hung, None},
		{"reset", true, Corrupt, Reset},
	} {
		for _, dir := range Directions {
			name := tc.mode + "/" + dir
			if tc.corrupt {
				name += "/corrupt"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				tg, err := listenTargets()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(tg.close)
				p := startProxy(t, tg.addr(), tc.mode, tc.corrupt)
				c := Case{Transport: "tls", Role: "middle", Direction: dir, Size: 1 << 20, Pace: time.Second,
					KillAfter: 300 * time.Millisecond, Wait: time.Second}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				dial := func() (net.Conn, error) { return net.Dial("tcp", p.ln.Addr().String()) }
				r, err := transfer(ctx, tg, dial, c, p.kill)
				if err != nil {
					t.Fatal(err)
				}
				if r.Verdict() != tc.want || r.Client.How != tc.how || r.Target.How != tc.how {
					t.Errorf("%s, want %s with both ends %s", r.Detail(), tc.want, tc.how)
				}
				// The kill came about 300 ms into 1 s: the receiver got
				// about a third, and an end seen came at once.
				if r.Received < c.Size/8 || r.Received > c.Size*3/4 {
					t.Errorf("received %d of %d bytes, want about a third", r.Received, c.Size)
				}
				for _, e := range []End{r.Client, r.Target} {
					if e.How != None && (e.After < 0 || e.After > 500*time.Millisecond) {
						t.Errorf("an end came %v after the kill, want at once", e.After)
					}
				}
			})
		}
	}
}

// TestTransferCompletes: with nothing killed in its path, the transfer
// ends clean at both ends with every byte, which is no ok: the kill missed.
func TestTransferCompletes(t *testing.T) {
	tg, err := listenTargets()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.close)
	p := startProxy(t, tg.addr(), "hang", false)
	for _, dir := range Directions {
		c := Case{Transport: "quic", Role: "entry", Direction: dir, Size: 1 << 20, Pace: 200 * time.Millisecond,
			KillAfter: 100 * time.Millisecond, Wait: time.Second}
		dial := func() (net.Conn, error) { return net.Dial("tcp", p.ln.Addr().String()) }
		r, err := transfer(context.Background(), tg, dial, c, func() error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict() != Missed || r.Received != c.Size || r.Sent != c.Size {
			t.Errorf("%s, want %s with every byte", r.Detail(), Missed)
		}
	}
}
