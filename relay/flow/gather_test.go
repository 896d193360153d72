package flow

import (
	"bytes"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hoplink/hoplink/relay/hop"

	"github.com/hoplink/hoplink/pki"
)

// sink is an End that keeps what is written to it and the size of each write.
type sink struct {
	got    bytes.Buffer
	writes []int
	closed bool
}

func (s *sink) Write(b []byte) (int, error) {
	s.writes = append(s.writes, len(b))
	return s.got.Write(b)
}
func (s *sink) Read([]byte) (int, error) { return 0, io.EOF }
func (s *sink) Wait() error              { return nil }
func (s *sink) CloseWrite() error        { s.closed = true; return nil }
func (s *sink) Abort()                   {}
func (s *sink) Fail(hop.Code)            {}
func (s *sink) Close()                   {}

// tlsPair returns a TLS connection between two identities over loopback TCP,
// its handshake done, with socket buffers large enough to hold size bytes.
func tlsPair(t *testing.T, size int) (client, server *tls.Conn) {
	t.Helper()
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.Identity("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.Identity("b")
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := pair(t)
	ra.SetWriteBuffer(2 * size)
	rb.SetReadBuffer(2 * size)
	client, server = tls.Client(ra, a.ClientConfig("b")), tls.Server(rb, b.ServerConfig(nil))
	errs := make(chan error, 1)
	go func() { errs <- client.Handshake() }()
	if err := server.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return client, server
}

// A bulk flow arriving over TLS leaves in writes of several records, not one
// write per 16 KiB record, and with every byte in order.
func TestTLSBulkLeavesInLargeWrites(t *testing.T) {
	const size = 1 << 20
	client, server := tlsPair(t, size)
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(rand.IntN(256))
	}
	// Records wait in the receiver's socket before the copy starts: all of
	// them, or as many as fill its buffers.
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(want)
		if err == nil {
			err = client.CloseWrite()
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		wrote <- err
	case <-time.After(200 * time.Millisecond):
	}
	var dst sink
	if _, err := copyHalf(&dst, TLS(server, func() {}), &count{}, &idleTimer{}, nil, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.got.Bytes(), want) || !dst.closed {
		t.Fatalf("got %d bytes (closed %v), want %d in order and EOF", dst.got.Len(), dst.closed, size)
	}
	largest := 0
	for _, n := range dst.writes {
		largest = max(largest, n)
	}
	if largest <= maxRecord {
		t.Fatalf("%d writes, the largest %d bytes: one record each", len(dst.writes), largest)
	}
	t.Logf("%d writes for %d bytes, the largest %d", len(dst.writes), size, largest)
}

// A TCP source's first read after it drained takes a small buffer; a burst
// that fills it still leaves in large writes, every byte in order, and a
// small message leaves whole, in one write.
func TestTCPBurstLeavesInLargeWrites(t *testing.T) {
	const size = 1 << 20
	client, in := pair(t)
	in.SetReadBuffer(4 << 20)
	src, err := TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(rand.IntN(256))
	}
	if _, err := client.Write([]byte("small request")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the request alone, then the burst
	wrote := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, err := client.Write(want)
		if err == nil {
			err = client.CloseWrite()
		}
		wrote <- err
	}()
	var dst sink
	if _, err := copyHalf(&dst, src, &count{}, &idleTimer{}, nil, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if dst.writes[0] != len("small request") {
		t.Fatalf("first write %d bytes, want the request whole", dst.writes[0])
	}
	if !bytes.Equal(dst.got.Bytes()[len("small request"):], want) || !dst.closed {
		t.Fatalf("got %d bytes (closed %v), want %d in order and EOF", dst.got.Len(), dst.closed, size)
	}
	largest := 0
	for _, n := range dst.writes {
		largest = max(largest, n)
	}
	if largest <= smallBufSize {
		t.Fatalf("%d writes, the largest %d bytes: no larger than the small buffer", len(dst.writes), largest)
	}
	t.Logf("%d writes for %d bytes, the largest %d", len(dst.writes), size, largest)
}
