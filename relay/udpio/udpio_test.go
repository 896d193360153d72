package udpio

import (
	"bytes"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

func pair(t *testing.T) (*net.UDPConn, *net.UDPConn) {
	t.Helper()
	a, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.DialUDP("udp", nil, a.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// Datagrams of every size, the largest included, come out whole and in
// order, with their sender, however the batches cut them.
func TestReaderBatches(t *testing.T) {
	ln, c := pair(t)
	sizes := []int{1, 1200, 1200, 65000, 3, 9000, 65000, 1400, 1400, 1400, 1400, 1400, 1400, 1400}
	for i, n := range sizes {
		if _, err := c.Write(bytes.Repeat([]byte{byte(i)}, n)); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(ln)
	var got int
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	for got < len(sizes) {
		before := got
		more, err := r.Read(func(p []byte, from netip.AddrPort) {
			if len(p) != sizes[got] || p[0] != byte(got) || p[len(p)-1] != byte(got) {
				t.Fatalf("datagram %d: %d bytes of %d, want %d of %d", got, len(p), p[0], sizes[got], got)
			}
			if from.String() != c.LocalAddr().String() {
				t.Fatalf("from %v, want %v", from, c.LocalAddr())
			}
			got++
		})
		if err != nil {
			t.Fatalf("after %d datagrams: %v", got, err)
		}
		// more says whether the call filled its slots: the entry flushes
		// its sessions' frames when the socket runs dry.
		if filled := got-before == readSlots; more != filled {
			t.Fatalf("a call that read %d of %d slots said more = %v", got-before, readSlots, more)
		}
	}
}

func TestWriterSendsInOrderAndBounds(t *testing.T) {
	ln, c := pair(t)
	var sent, failed atomic.Int64
	ln.SetReadBuffer(4 << 20) // the whole burst waits in it: none may be dropped
	w := NewWriter(c, func(n int) { sent.Add(int64(n)) }, func() { failed.Add(1) })
	const n = 300
	for i := range n {
		if !w.Write([]byte{byte(i), byte(i >> 8), 7, 7}) {
			t.Fatalf("datagram %d refused with an empty queue", i)
		}
	}
	buf := make([]byte, 100)
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		k, err := ln.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if k != 4 || int(buf[0])|int(buf[1])<<8 != i {
			t.Fatalf("datagram %d came as %v", i, buf[:k])
		}
	}
	for i := 0; sent.Load() != 4*n && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if sent.Load() != 4*n || failed.Load() != 0 {
		t.Fatalf("counted %d bytes sent, %d failed; want %d, 0", sent.Load(), failed.Load(), 4*n)
	}

	// The queue is bounded: with the writer held, Write refuses past MaxQueue.
	w.mu.Lock()
	held := len(w.queue)
	w.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d still queued", held)
	}
	w.mu.Lock()
	w.queue = append(w.queue, make([][]byte, MaxQueue)...)
	w.mu.Unlock()
	if w.Write([]byte("x")) {
		t.Fatal("a full queue took one more")
	}
	w.Close()
	if w.Write([]byte("x")) {
		t.Fatal("a closed writer took a datagram")
	}
}

// A target that refuses (ICMP port unreachable on a connected socket)
// costs the datagrams it refused, counted, and the writer goes on.
func TestWriterGoesOnAfterRefusal(t *testing.T) {
	ln, c := pair(t)
	ln.Close() // nothing listens: the kernel reports refusals
	var failed atomic.Int64
	w := NewWriter(c, func(int) {}, func() { failed.Add(1) })
	defer w.Close()
	for i := 0; failed.Load() == 0 && i < 200; i++ {
		w.Write([]byte("x"))
		time.Sleep(5 * time.Millisecond)
	}
	if failed.Load() == 0 {
		t.Fatal("no refusal counted")
	}
}

// Runs of equal-sized datagrams, cut by the kernel where it segments UDP,
// reach the target as the datagrams they were, in order, whatever their
// sizes.
func TestWriterKeepsDatagramsWhole(t *testing.T) {
	ln, c := pair(t)
	ln.SetReadBuffer(4 << 20)
	var sizes []int
	for range 100 {
		sizes = append(sizes, 1200)
	}
	sizes = append(sizes, 700, 1200, 1200, 1300, 1300, 0, 5, 5, 65000, 9000, 9000, 9000, 9000, 9000, 9000, 9000, 9000, 1)
	var sent atomic.Int64
	w := NewWriter(c, func(n int) { sent.Add(1) }, func() {})
	defer w.Close()
	w.mu.Lock() // queue them all before the writer looks, so they go in runs
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte(i)}, n)
		w.queue = append(w.queue, p)
	}
	w.mu.Unlock()
	w.wake <- struct{}{}
	buf := make([]byte, 1<<16)
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i, n := range sizes {
		k, err := ln.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if k != n || (k > 0 && (buf[0] != byte(i) || buf[k-1] != byte(i))) {
			t.Fatalf("datagram %d: %d bytes starting %v, want %d of %d", i, k, buf[:min(k, 4)], n, byte(i))
		}
	}
	for i := 0; sent.Load() != int64(len(sizes)) && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if sent.Load() != int64(len(sizes)) {
		t.Fatalf("counted %d sent, want %d", sent.Load(), len(sizes))
	}
}

// A datagram the kernel refuses every time (larger than UDP allows) is
// dropped and counted once; the writer does not retry it forever and the
// datagrams behind it go out.
func TestWriterDropsWhatTheKernelAlwaysRefuses(t *testing.T) {
	ln, c := pair(t)
	var failed atomic.Int64
	w := NewWriter(c, func(int) {}, func() { failed.Add(1) })
	defer w.Close()
	w.Write(make([]byte, 70000))
	w.Write([]byte("after"))
	buf := make([]byte, 100)
	ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := ln.Read(buf)
	if err != nil || string(buf[:k]) != "after" {
		t.Fatalf("got %q, %v; want the datagram behind the refused one", buf[:k], err)
	}
	if failed.Load() != 1 {
		t.Fatalf("%d failures counted, want 1", failed.Load())
	}
}

func TestRun(t *testing.T) {
	n := func(sizes ...int) [][]byte {
		var p [][]byte
		for _, s := range sizes {
			p = append(p, make([]byte, s))
		}
		return p
	}
	many := make([]int, 100)
	for i := range many {
		many[i] = 1000
	}
	for _, tc := range []struct {
		name string
		pkts [][]byte
		want int
	}{
		{"one", n(1200), 1},
		{"equal", n(1200, 1200, 1200), 3},
		{"a shorter last", n(1200, 1200, 800, 1200), 3},
		{"a longer one ends it", n(1200, 1300, 1200), 1},
		{"empty alone", n(0, 0), 1},
		{"empty never ends a run", n(5, 5, 0), 2},
		{"at most 64", n(many...), 64},
		{"at most one IP datagram", n(30000, 30000, 30000), 2},
	} {
		if got := run(tc.pkts); got != tc.want {
			t.Errorf("%s: run %d, want %d", tc.name, got, tc.want)
		}
	}
}
