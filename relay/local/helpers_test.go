package local

import (
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
)

// freePort finds a port free for both TCP and UDP on loopback.
func freePort(t *testing.T) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

type tunnelSpec struct {
	name, protocol, target string
	port                   int
	extra                  string
}

// network writes manifests for relays r0..rN-1 on loopback, a chain along
// route, and the given tunnels, then starts them in this process.
func network(t *testing.T, nRelays int, route []string, tunnels ...tunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	return networkOver(t, "quic", nRelays, route, tunnels...)
}

// networkOver is network with the chain's transport for TCP flows.
func networkOver(t *testing.T, transport string, nRelays int, route []string, tunnels ...tunnelSpec) (*Network, *metrics.Metrics, *manifest.Set) {
	t.Helper()
	var b strings.Builder
	for i := range nRelays {
		p := freePort(t)
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: r%d}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n", i, p, p)
	}
	via := ""
	if len(route) > 2 {
		via = "via: [" + strings.Join(route[1:len(route)-1], ", ") + "], "
	}
	fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: %s, exit: %s, %sroute: [%s], transport: %s}\n",
		route[0], route[len(route)-1], via, strings.Join(route, ", "), transport)
	for _, tn := range tunnels {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, protocol: %s, listen: {address: 127.0.0.1, port: %d}, target: %q %s}\n",
			tn.name, tn.protocol, tn.port, tn.target, tn.extra)
	}
	set, err := manifest.Parse("test.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("manifests: %v\n%s", err, b.String())
	}
	m := metrics.New(prometheus.NewRegistry())
	n, err := Start(set, relay.Config{Metrics: m, Log: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, m, set
}

func testLogger() *slog.Logger {
	lvl := slog.LevelWarn
	if os.Getenv("HOPLINK_TEST_DEBUG") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// tcpServer accepts connections and runs handle on each until the test ends.
func tcpServer(t *testing.T, handle func(c *net.TCPConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
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
	}()
	return ln.Addr().String()
}

func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// dialTunnel connects to a tunnel's listener, retrying while peer
// connections come up (bounded).
func dialTunnel(t *testing.T, port int) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c.(*net.TCPConn)
}

// randReader is a deterministic stream of n pseudo-random bytes.
func randReader(seed uint64, n int64) io.Reader {
	return io.LimitReader(&prng{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, n)
}

type prng struct{ r *rand.Rand }

func (p *prng) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.r.Uint32())
	}
	return len(b), nil
}

func digest(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d, n, err
}
