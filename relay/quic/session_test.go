package quic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/pki"
)

// sessionPair opens a session from a to b and returns both ends.
func sessionPair(t *testing.T) (near, far *Session) {
	t.Helper()
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	streams := make(chan *Session, 1)
	handler := func(c *Conn, s *quicgo.Stream) { streams <- NewSession(c, s) }
	a, b := testEndpointWith(t, ca, "a", handler), testEndpointWith(t, ca, "b", handler)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, s, err := a.Links().Link("b", "t", []string{b.Addr().String()}).OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	near = NewSession(c, s)
	near.SendFrame([]byte("hello")) // shows b the stream
	select {
	case far = <-streams:
	case <-ctx.Done():
		t.Fatal("no stream at b")
	}
	return near, far
}

// An Auto session sends datagrams while its rate is low and turns to
// frames, once, past AutoFramesRate; frames wait for Flush and arrive
// whole and in order.
func TestSessionModes(t *testing.T) {
	near, far := sessionPair(t)
	var dgrams, frames atomic.Int64
	far.Receive(func([]byte) { dgrams.Add(1) })
	order := make(chan int, 1<<16)
	go far.ReadFrames(func(p []byte) {
		if len(p) == 1200 {
			frames.Add(1)
			order <- int(p[0]) | int(p[1])<<8
		}
	}, nil)

	var turned atomic.Int64
	at := -1 // the packet of the burst that turned the session
	var i int
	near.SetMode(Auto, func() { turned.Add(1); at = i })
	// A rate a race-instrumented build reaches too (the mechanism is what
	// is tested; AutoFramesRate is the production figure).
	const rate = 2000
	near.rate = rate
	// A slow start: 20 datagrams well under the rate.
	p := make([]byte, 1200)
	for range 20 {
		if err := near.Send(p[:100]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if near.Framed() {
		t.Fatal("framed at a low rate")
	}
	// A burst above it.
	const burst = 5000
	for i = 0; i < burst; i++ {
		p[0], p[1] = byte(i), byte(i>>8)
		if err := near.Send(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := near.Flush(); err != nil {
		t.Fatal(err)
	}
	if !near.Framed() || turned.Load() != 1 {
		t.Fatalf("framed %v, told %d times", near.Framed(), turned.Load())
	}
	// The rate is counted per 100 ms: the switch came after at least
	// rate/10 packets (the slow start's count too, in the same window), or
	// later on a slow host.
	if at < rate/10-20 {
		t.Fatalf("turned at packet %d of the burst", at)
	}
	want := int64(burst - at)
	deadline := time.Now().Add(5 * time.Second)
	for frames.Load() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Those sent before the switch went as datagrams; all after, framed
	// and in order, none lost.
	n := frames.Load()
	if n != want {
		t.Fatalf("%d frames of the burst arrived, want %d (turned at %d)", n, want, at)
	}
	last := at - 1
	for range n {
		i := <-order
		if i <= last {
			t.Fatalf("frame %d after %d", i, last)
		}
		last = i
	}
	if last != burst-1 {
		t.Fatalf("last frame %d, want %d", last, burst-1)
	}

	// A Datagrams session never frames whatever its rate.
	near.SetMode(Datagrams, nil)
	for range 3000 {
		near.Send(p[:100])
	}
	if near.Framed() {
		t.Fatal("a Datagrams session framed")
	}
}
