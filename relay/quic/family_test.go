package quic

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/eyeballs"
)

// needIPv6Loopback skips where the host has no ::1 (a container with IPv6
// off).
func needIPv6Loopback(t *testing.T) {
	t.Helper()
	c, err := net.ListenPacket("udp", "[::1]:0")
	if err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	}
	c.Close()
}

// deadUDPPort is a port on host where nothing listens: bound a moment to
// learn a free one, then closed.
func deadUDPPort(t *testing.T, host string) string {
	t.Helper()
	c, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	a := c.LocalAddr().String()
	c.Close()
	return a
}

// A peer published on both families is dialed on both, IPv6 first, and the
// link comes up on whichever answers: with one family dead (nothing
// listening there, so its handshake would only time out after 5 s) the
// link is up on the other within a second, and hoplink_peer_family_info
// says which family it runs on. A relay bound to one family's address
// dials that family only.
func TestLinkUpOnTheFamilyThatAnswers(t *testing.T) {
	needIPv6Loopback(t)
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	// b on every address (a dual-stack socket), so ::1 and 127.0.0.1 both
	// reach it.
	b := testEndpointOpts(t, ca, "b", func(c *Conn, s *quicgo.Stream) { s.Close() }, func(o *Options) { o.Listen = ":0" })
	port := strconv.Itoa(b.Addr().(*net.UDPAddr).Port)
	v6, v4 := net.JoinHostPort("::1", port), net.JoinHostPort("127.0.0.1", port)
	for _, tc := range []struct {
		name   string
		listen string // a's
		eps    []string
		family string
	}{
		{"both answer: ipv6 preferred", ":0", []string{v4, v6}, eyeballs.IPv6},
		{"ipv6 dead: up on ipv4", ":0", []string{deadUDPPort(t, "::1"), v4}, eyeballs.IPv4},
		{"ipv4 dead: up on ipv6", ":0", []string{deadUDPPort(t, "127.0.0.1"), v6}, eyeballs.IPv6},
		{"dialing relay bound to ipv4: its family only", "127.0.0.1:0", []string{v6, v4}, eyeballs.IPv4},
		{"dialing relay bound to ipv6: its family only", "[::1]:0", []string{v4, v6}, eyeballs.IPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			a := testEndpointOpts(t, ca, "a", nil, func(o *Options) { o.Listen, o.Metrics = tc.listen, metrics.New(reg) })
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := a.Links().Link("b", Control, tc.eps).Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// One Delay for a dead first family, plus a handshake on
			// loopback: far below the 5 s a dead address alone costs.
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("link up after %v", took)
			}
			if got := eyeballs.FamilyOf(c.RemoteAddr()); got != tc.family {
				t.Errorf("link runs on %s (%v), want %s", got, c.RemoteAddr(), tc.family)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				got := promtest.ToFloat64(a.opts.Metrics.PeerFamily.WithLabelValues("a", "b", tc.family))
				n := promtest.CollectAndCount(a.opts.Metrics.PeerFamily)
				if got == 1 && n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("hoplink_peer_family_info{family=%q} = %v with %d series, want 1 alone", tc.family, got, n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// The race's addresses for a link: endpoints resolved, families
// interleaved IPv6 first, which the dial above relies on.
func TestLinkDialOrder(t *testing.T) {
	got := eyeballs.Order([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("[::1]:1")})
	if got[0].Addr().Is4() {
		t.Errorf("order %v: IPv6 first", got)
	}
}

// udpForwarder relays datagrams from listen to target and the answers back
// to the last sender, until closed: a path of its own for one family.
func udpForwarder(t *testing.T, listen, target string) (addr string, stop func()) {
	t.Helper()
	in, err := net.ListenPacket("udp", listen)
	if err != nil {
		t.Fatal(err)
	}
	to, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	out, err := net.DialUDP("udp", nil, to)
	if err != nil {
		t.Fatal(err)
	}
	var last atomic.Pointer[net.Addr]
	go func() {
		b := make([]byte, 65536)
		for {
			n, from, err := in.ReadFrom(b)
			if err != nil {
				return
			}
			last.Store(&from)
			out.Write(b[:n])
		}
	}()
	go func() {
		b := make([]byte, 65536)
		for {
			n, err := out.Read(b)
			if err != nil {
				return
			}
			if p := last.Load(); p != nil {
				in.WriteTo(b[:n], *p)
			}
		}
	}()
	stop = func() { in.Close(); out.Close() }
	t.Cleanup(stop)
	return in.LocalAddr().String(), stop
}

// A link up on IPv6 whose IPv6 path dies comes back on IPv4 once the
// connection times out: each redial races both families again, and the
// family metric follows.
func TestLinkFallsBackWhenItsFamilyDies(t *testing.T) {
	needIPv6Loopback(t)
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	b := testEndpointOpts(t, ca, "b", func(c *Conn, s *quicgo.Stream) { s.Close() }, func(o *Options) { o.Listen = ":0" })
	v4 := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Addr().(*net.UDPAddr).Port))
	v6, cut := udpForwarder(t, "[::1]:0", v4) // b over IPv6, through a path the test can cut
	reg := prometheus.NewRegistry()
	a := testEndpointOpts(t, ca, "a", nil, func(o *Options) { o.Listen, o.Metrics = ":0", metrics.New(reg) })
	link := a.Links().Link("b", Control, []string{v4, v6})
	onFamily := func(family string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			c := link.Live()
			if c != nil && eyeballs.FamilyOf(c.RemoteAddr()) == family &&
				promtest.ToFloat64(a.opts.Metrics.PeerFamily.WithLabelValues("a", "b", family)) == 1 &&
				promtest.CollectAndCount(a.opts.Metrics.PeerFamily) == 1 {
				return
			}
			if time.Now().After(deadline) {
				var remote net.Addr
				if c != nil {
					remote = c.RemoteAddr()
				}
				t.Fatalf("link not up on %s within %v (connection to %v)", family, within, remote)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	onFamily(eyeballs.IPv6, 5*time.Second)
	cut()
	// The idle timeout (3 s), the first redial's backoff, one Delay.
	onFamily(eyeballs.IPv4, 10*time.Second)
}
