package tlslink

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// What is written between Hold and Flush reaches the peer only at Flush,
// all together; other writes go straight out.
func TestRecordConnHoldsUntilFlush(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c := wrap(raw).(*recordConn)
	defer c.Close()
	if TCP(c) != raw {
		t.Fatal("TCP does not return the connection under the wrapper")
	}
	read := func(n int, within time.Duration) (string, error) {
		peer.SetReadDeadline(time.Now().Add(within))
		b := make([]byte, n)
		_, err := io.ReadFull(peer, b)
		return string(b), err
	}

	c.Write([]byte("now"))
	if got, err := read(3, time.Second); err != nil || got != "now" {
		t.Fatalf("a write outside Hold: got %q, %v", got, err)
	}
	c.Hold()
	c.Write([]byte("rec1"))
	c.Write([]byte("rec2"))
	if _, err := read(1, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("held records reached the peer before Flush (%v)", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, err := read(8, time.Second); err != nil || got != "rec1rec2" {
		t.Fatalf("after Flush: got %q, %v", got, err)
	}
	if err := c.Flush(); err != nil { // nothing held: nothing to send
		t.Fatal(err)
	}
}

// TestCloseEndsABlockedWrite: a relay stopping closes its link
// connections to end the flows on them, among them writes blocked on a
// peer that reads nothing. Close must not wait for such a write.
func TestCloseEndsABlockedWrite(t *testing.T) {
	raw, _ := testutil.TCPPair(t) // whose peer reads nothing
	c := wrap(raw).(*recordConn)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20)) // far more than the buffers hold
		wrote <- err
	}()
	time.Sleep(200 * time.Millisecond) // the write is blocked by now
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a write blocked on a full socket")
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the blocked write reported success after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked write did not end after Close")
	}
}
