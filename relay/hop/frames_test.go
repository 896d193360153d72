package hop

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestFramesStall: behind a connection whose reader stopped, a write of
// frames fails after Stall, not never.
func TestFramesStall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept() // and never read
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	f := &Frames{W: c, Stall: 100 * time.Millisecond}
	p := make([]byte, 60000)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		// Far more than the two sockets' buffers hold.
		for range 100_000 {
			if err := f.Queue(p); err != nil {
				done <- err
				return
			}
		}
		done <- f.Flush()
	}()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("writes into a stalled connection: %v, want a deadline error", err)
		}
		t.Logf("failed after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("a write into a stalled connection blocked for 10 s with Stall set to 100 ms")
	}
}

// TestFramesQueueAndFlush: frames wait for Flush or framesFlushAt, then
// leave in one write, and read back whole.
func TestFramesQueueAndFlush(t *testing.T) {
	var w countingWriter
	f := &Frames{W: &w}
	for i := range 10 {
		f.Queue(bytes.Repeat([]byte{byte(i)}, 100))
	}
	if w.writes != 0 {
		t.Fatalf("%d writes before Flush", w.writes)
	}
	f.Flush()
	if w.writes != 1 || w.Len() != 10*102 {
		t.Fatalf("Flush: %d writes of %d bytes, want 1 of %d", w.writes, w.Len(), 10*102)
	}
	for range 40 {
		f.Queue(make([]byte, 1000))
	}
	// The 33rd frame of 1002 bytes passes framesFlushAt.
	if w.writes != 2 || w.Len() != 10*102+33*1002 {
		t.Fatalf("40 frames of 1000 bytes: %d writes, %d bytes written; want 2, %d", w.writes, w.Len(), 10*102+33*1002)
	}
	buf := make([]byte, MaxFrame)
	for i := range 10 {
		p, err := ReadFrame(&w.Buffer, buf)
		if err != nil || len(p) != 100 || p[0] != byte(i) {
			t.Fatalf("frame %d: %d bytes, err %v", i, len(p), err)
		}
	}
}

type countingWriter struct {
	bytes.Buffer
	writes int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.Buffer.Write(p)
}
