package testutil

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WaitFor calls f every 200 ms until it returns nil, and fails the test
// with what and f's last error when 30 s have passed.
func WaitFor(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SinkThenSource starts a ServeSinkThenSource target on loopback until the
// test ends and returns its address.
func SinkThenSource(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go ServeSinkThenSource(ln)
	return ln.Addr().String()
}

// ServeSinkThenSource reads each connection to EOF, then answers with as
// many pseudo-random bytes (seeded by the count) followed by the SHA-256 of
// what it read, and closes: the target TCPExchange checks.
func ServeSinkThenSource(ln net.Listener) {
	Serve(ln, func(c *net.TCPConn) {
		h := sha256.New()
		n, _ := io.Copy(h, c)
		io.Copy(c, RandReader(uint64(n), n))
		c.Write(h.Sum(nil))
	})
}

// TCPExchange sends size bytes to a ServeSinkThenSource target, half-closes,
// and checks the answer: size bytes of the expected stream, then the digest
// of what was sent.
func TCPExchange(dial func() (net.Conn, error), size int64) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	sent := sha256.New()
	go func() {
		io.Copy(c, io.TeeReader(RandReader(1, size), sent))
		c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got := sha256.New()
	n, err := io.Copy(got, io.LimitReader(c, size))
	if err != nil || n != size {
		return fmt.Errorf("answer: %d of %d bytes, %v", n, size, err)
	}
	want := sha256.New()
	io.Copy(want, RandReader(uint64(size), size))
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		return fmt.Errorf("answer corrupted")
	}
	digest, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("digest: %v", err)
	}
	if !bytes.Equal(digest, sent.Sum(nil)) {
		return fmt.Errorf("target received different bytes than were sent (%d-byte digest)", len(digest))
	}
	return nil
}

// Root is the repository's root: the directory above the test's that holds
// go.mod. A helper that reads the repository's files finds them from any
// package's tests.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}
