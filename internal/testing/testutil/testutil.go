// Package testutil holds what tests across the repository need once: free
// ports, TCP servers, deterministic payloads, a quiet logger, and network
// namespaces of a test's own. Tests only.
package testutil

import (
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/freeport"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
)

// FreePort finds a port free for both TCP and UDP on every address (a
// relay listens on both with one number), never the same twice in a test
// process; see package freeport for where it comes from.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TCPPair returns both ends of a loopback TCP connection, closed when the
// test ends.
func TCPPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.AcceptTCP()
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TCPServer accepts connections on loopback and runs handle on each until
// the test ends; it returns the address.
func TCPServer(t testing.TB, handle func(c *net.TCPConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go Serve(ln, handle)
	return ln.Addr().String()
}

// Serve runs handle on each connection ln accepts, until ln closes.
func Serve(ln net.Listener, handle func(c *net.TCPConn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c.(*net.TCPConn))
		}()
	}
}

// Echo sends back what it reads, then half-closes.
func Echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// EchoServer is a TCPServer that echoes.
func EchoServer(t testing.TB) string { return TCPServer(t, Echo) }

// RandReader is a deterministic stream of n pseudo-random bytes.
func RandReader(seed uint64, n int64) io.Reader {
	return io.LimitReader(&prng{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, n)
}

type prng struct{ r *rand.Rand }

func (p *prng) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.r.Uint32())
	}
	return len(b), nil
}

// Digest is the SHA-256 of what r reads, and how much it read.
func Digest(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d, n, err
}

// Logger logs warnings to stderr, or everything with HOPLINK_TEST_DEBUG set.
func Logger() *slog.Logger {
	lvl := slog.LevelWarn
	if os.Getenv("HOPLINK_TEST_DEBUG") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// Namespace gives the test a network namespace of its own, removed when
// it ends, so devices and routes never touch the host's. It needs root:
// elsewhere the test is skipped, except in CI (gate.Missing); as root, a
// namespace that cannot be made fails the test.
func Namespace(t testing.TB, prefix string) *linkemu.Node {
	t.Helper()
	if os.Geteuid() != 0 {
		gate.Missing(t, "network namespaces need root")
	}
	n, err := linkemu.NewNet(fmt.Sprintf("%s%d", prefix, os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	node, err := n.AddNode("a")
	if err != nil {
		t.Fatal(err)
	}
	return node
}
