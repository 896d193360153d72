package flow

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

type count struct{ n atomic.Int64 }

func (c *count) Add(v float64) { c.n.Add(int64(v)) }

// pair returns both ends of a loopback TCP connection.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) { return testutil.TCPPair(t) }

// joined makes client <-> [relay: in | out] <-> target and joins the
// relay's two ends, as a relay joins a client and its next hop.
func joined(t *testing.T, join func(in, out *net.TCPConn, up, down Counter) error) (client, target *net.TCPConn, up, down *count, done chan error) {
	return joinedWith(t, join, nil)
}

// joinedWith is joined with the four sockets' buffers set by bufs first.
func joinedWith(t *testing.T, join func(in, out *net.TCPConn, up, down Counter) error, bufs func(client, in, out, target *net.TCPConn)) (client, target *net.TCPConn, up, down *count, done chan error) {
	client, in := pair(t)
	out, target := pair(t)
	if bufs != nil {
		bufs(client, in, out, target)
	}
	up, down, done = &count{}, &count{}, make(chan error, 1)
	go func() { done <- join(in, out, up, down) }()
	return client, target, up, down, done
}

func viaJoin(in, out *net.TCPConn, up, down Counter) error {
	return viaEnds(in, out, up, down, Join)
}

// viaHalves is viaJoin on a goroutine per direction, as flows with an end
// that is no socket are joined (and every flow without loops).
func viaHalves(in, out *net.TCPConn, up, down Counter) error {
	return viaEnds(in, out, up, down, joinHalves)
}

func viaSplice(in, out *net.TCPConn, up, down Counter) error { return Splice(in, out, up, down, 0) }

func viaEnds(in, out *net.TCPConn, up, down Counter, join func(a, b End, up, down Counter, idle time.Duration) error) error {
	a, err := TCP(in)
	if err != nil {
		return err
	}
	b, err := TCP(out)
	if err != nil {
		return err
	}
	return join(a, b, up, down, 0)
}

func TestJoinCarriesBothWaysAndHalfCloses(t *testing.T) {
	for name, join := range joins {
		t.Run(name, func(t *testing.T) {
			client, target, up, down, done := joined(t, join)
			request := bytes.Repeat([]byte("q"), 300<<10) // more than one copy buffer
			go func() {
				client.Write(request)
				client.CloseWrite() // the client is done sending, still reading
			}()
			got, err := io.ReadAll(target)
			if err != nil || !bytes.Equal(got, request) {
				t.Fatalf("target read %d bytes (%v), want %d", len(got), err, len(request))
			}
			// The half-close reached the target; it still answers.
			if _, err := target.Write([]byte("answer")); err != nil {
				t.Fatal(err)
			}
			target.CloseWrite()
			answer, err := io.ReadAll(client)
			if err != nil || string(answer) != "answer" {
				t.Fatalf("client read %q (%v)", answer, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("clean end reported %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("join did not end after both directions closed")
			}
			if up.n.Load() != int64(len(request)) || down.n.Load() != 6 {
				t.Fatalf("counted up %d, down %d", up.n.Load(), down.n.Load())
			}
		})
	}
}

// TestResetTravels: a target that resets its connection resets the
// client's too, rather than closing it cleanly.
func TestResetTravels(t *testing.T) {
	client, target, _, _, done := joined(t, viaJoin)
	client.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(target, buf); err != nil {
		t.Fatal(err)
	}
	target.SetLinger(0)
	target.Close()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadAll(client)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client saw %v, want a reset", err)
	}
	if err := <-done; err == nil {
		t.Fatal("join reported a reset as a clean end")
	}
}

// TestWaitParksUntilReadable: Wait, which lets an idle flow hold no copy
// buffer, blocks while the socket has nothing to read.
func TestWaitParksUntilReadable(t *testing.T) {
	_, in := pair(t)
	a, err := TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- a.Wait() }()
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v with no data", err)
	case <-time.After(50 * time.Millisecond):
	}
	in.SetReadDeadline(time.Now())
	if err := <-waited; err == nil {
		t.Fatal("Wait missed the deadline")
	}
}

// TestIdleFlowIsReset: a flow that moves no byte for its idle timeout is
// reset at both ends and reported as idle; one that keeps talking is not.
func TestIdleFlowIsReset(t *testing.T) {
	for name, join := range map[string]func(in, out *net.TCPConn, up, down Counter) error{
		"join": func(in, out *net.TCPConn, up, down Counter) error {
			a, _ := TCP(in)
			b, _ := TCP(out)
			return Join(a, b, up, down, time.Second)
		},
		"halves": func(in, out *net.TCPConn, up, down Counter) error {
			a, _ := TCP(in)
			b, _ := TCP(out)
			return joinHalves(a, b, up, down, time.Second)
		},
		"splice": func(in, out *net.TCPConn, up, down Counter) error {
			return Splice(in, out, up, down, time.Second)
		},
	} {
		t.Run(name, func(t *testing.T) {
			client, target, _, _, done := joined(t, join)
			// 1.5 s of talk, a byte every 300 ms: longer than the 1 s
			// timeout, with room for a busy host between bytes.
			for range 5 {
				client.Write([]byte("x"))
				if _, err := io.ReadFull(target, make([]byte, 1)); err != nil {
					t.Fatalf("a talking flow ended: %v", err)
				}
				time.Sleep(300 * time.Millisecond)
			}
			start := time.Now()
			select {
			case err := <-done:
				if !errors.Is(err, ErrIdle) {
					t.Fatalf("ended with %v, want ErrIdle", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("an idle flow stayed open")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("reset %v after going idle", d)
			}
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the client saw %v, want a reset", err)
			}
		})
	}
}

// TestReadWhenReadyHoldsNoBufferWhileParked: a TCP source reads in one
// system call once data arrives, and takes its buffer only then; a reset
// comes back as an error, never as a clean end.
func TestReadWhenReadyHoldsNoBufferWhileParked(t *testing.T) {
	client, in := pair(t)
	a, err := TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	var taken atomic.Int64
	pool := &sync.Pool{New: func() any { taken.Add(1); b := make([]byte, 64); return &b }}
	type result struct {
		bp  *[]byte
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() { bp, n, err := a.ReadWhenReady(pool); got <- result{bp, n, err} }()
	time.Sleep(50 * time.Millisecond) // parked, its buffer given back
	client.Write([]byte("request"))
	r := <-got
	if r.err != nil || string((*r.bp)[:r.n]) != "request" {
		t.Fatalf("read %q, %v", (*r.bp)[:r.n], r.err)
	}
	if n := taken.Load(); n > 2 {
		t.Fatalf("%d buffers made for one message", n)
	}

	// A reset: the read reports it.
	client.SetLinger(0)
	client.Close()
	time.Sleep(20 * time.Millisecond)
	_, _, err = a.ReadWhenReady(pool)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after a reset: %v, want ECONNRESET", err)
	}
}

// TestReadWhenReadyAllocatesNothing: a small message read from a TCP source
// costs no allocation (a closure per read did, and a relay's collections
// follow what it allocates per request).
func TestReadWhenReadyAllocatesNothing(t *testing.T) {
	client, in := pair(t)
	a, err := TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 64)
	allocs := testing.AllocsPerRun(200, func() {
		client.Write(msg)
		bp, n, err := a.ReadWhenReady(&smallBufPool)
		if err != nil || n == 0 {
			t.Fatal(n, err)
		}
		smallBufPool.Put(bp)
	})
	// Under the race detector sync.Pool drops a share of what it is given.
	if allocs >= 1 {
		t.Fatalf("%.1f allocations per message", allocs)
	}
}

// TestResetSeenByTheStallWatchNamesItsEnd: a client resets while the flow's
// write to its target is stuck (the target reads nothing). Nothing reads
// the client then, so the stall watch finds the reset and resets the flow;
// the stuck write fails too, after it, and must not be taken for the
// failure: the flow ends Broken at the client's side, which the relay
// counts as a client_reset (or, at a middle, a prev_hop_reset), never as
// the target's.
func TestResetSeenByTheStallWatchNamesItsEnd(t *testing.T) {
	for name, join := range joins {
		t.Run(name, func(t *testing.T) {
			client, _, _, _, done := joined(t, join)
			// Write until the target's buffers and the relay's are full.
			chunk := make([]byte, 64<<10)
			for {
				client.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
				if _, err := client.Write(chunk); err != nil {
					break
				}
			}
			client.SetLinger(0)
			client.Close()
			var b *Broken
			select {
			case err := <-done:
				if !errors.As(err, &b) || b.At != A {
					t.Errorf("ended with %v (%+v), want Broken at the client's side", err, b)
				}
			case <-time.After(3 * stallCheckMax):
				t.Fatal("the flow did not end")
			}
		})
	}
}

// TestBrokenSaysWhichEndFailed: a flow reset by its target or by its
// client ends in a Broken error naming that end first, joined or spliced:
// what a relay counts a flow's error under.
func TestBrokenSaysWhichEndFailed(t *testing.T) {
	for _, join := range []struct {
		name string
		f    func(in, out *net.TCPConn, up, down Counter) error
	}{{"join", viaJoin}, {"halves", viaHalves}, {"splice", viaSplice}} {
		for _, tc := range []struct {
			name string
			want Side
		}{{"client resets", A}, {"target resets", B}} {
			t.Run(join.name+"/"+tc.name, func(t *testing.T) {
				client, target, _, _, done := joined(t, join.f)
				client.Write([]byte("hello"))
				if _, err := io.ReadFull(target, make([]byte, 5)); err != nil {
					t.Fatal(err)
				}
				failing := map[Side]*net.TCPConn{A: client, B: target}[tc.want]
				failing.SetLinger(0)
				failing.Close()
				var b *Broken
				select {
				case err := <-done:
					if !errors.As(err, &b) || b.At != tc.want {
						t.Errorf("ended with %v (%+v), want Broken at side %d", err, b, tc.want)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the flow did not end")
				}
			})
		}
	}
}
