package relay_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/relay"
)

// proxyTarget is a target that expects a PROXY header: on TCP first on the
// connection (then it echoes), on UDP first in every datagram (it answers
// with the datagram's payload). It reports each header's source and
// destination, or what was wrong.
type proxyTarget struct {
	addr string
	seen chan string // "SRC DST", or "error: ..."
}

func tcpProxyTarget(t *testing.T) *proxyTarget {
	pt := &proxyTarget{seen: make(chan string, 16)}
	pt.addr = testutil.TCPServer(t, func(c *net.TCPConn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		h, err := proxyproto.Read(r)
		if err != nil {
			pt.seen <- "error: " + err.Error()
			return
		}
		pt.seen <- fmt.Sprintf("v%d %s %s", h.Version, h.SourceAddr, h.DestinationAddr)
		io.Copy(c, r)
	})
	return pt
}

func udpProxyTarget(t *testing.T) *proxyTarget {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	pt := &proxyTarget{addr: pc.LocalAddr().String(), seen: make(chan string, 64)}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r := bufio.NewReader(bytes.NewReader(buf[:n]))
			h, err := proxyproto.Read(r)
			if err != nil {
				pt.seen <- "error: " + err.Error()
				continue
			}
			pt.seen <- fmt.Sprintf("v%d %s %s", h.Version, h.SourceAddr, h.DestinationAddr)
			payload, _ := io.ReadAll(r)
			pc.WriteTo(payload, from)
		}
	}()
	return pt
}

// A target behind a Tunnel with spec.proxyProtocol sees each client's own
// address and port, and the address it connected to, through a three-hop
// chain and through a lone relay; TCP with v1 and v2, UDP with v2 on every
// datagram; and the bytes after the header are the client's, intact.
func TestProxyProtocol(t *testing.T) {
	for _, route := range [][]string{{"r0", "r1", "r2", "r3"}, {"r0"}} {
		for _, tc := range []struct{ protocol, version string }{{"tcp", "v1"}, {"tcp", "v2"}, {"udp", "v2"}} {
			t.Run(fmt.Sprintf("%d relays/%s/%s", len(route), tc.protocol, tc.version), func(t *testing.T) {
				var pt *proxyTarget
				if tc.protocol == "tcp" {
					pt = tcpProxyTarget(t)
				} else {
					pt = udpProxyTarget(t)
				}
				port := testutil.FreePort(t)
				network(t, len(route), route, testutil.TunnelSpec{Name: "p", Protocol: tc.protocol, Target: pt.addr, Port: port, Extra: ", proxyProtocol: " + tc.version})
				listen := fmt.Sprintf("127.0.0.1:%d", port)
				payload := make([]byte, 3000)
				for i := range payload {
					payload[i] = byte(i * 7)
				}
				var client string
				if tc.protocol == "tcp" {
					c := testutil.DialTunnel(t, port)
					defer c.Close()
					client = c.LocalAddr().String()
					go func() { c.Write(payload); c.CloseWrite() }()
					got, err := io.ReadAll(c)
					if err != nil || !bytes.Equal(got, payload) {
						t.Fatalf("echo: %d of %d bytes intact (%v)", len(got), len(payload), err)
					}
				} else {
					c := udpClient(t, port)
					client = c.LocalAddr().String()
					for i := range 3 {
						if err := roundTrip(c, payload[:1000+i]); err != nil {
							t.Fatalf("datagram %d: %v", i, err)
						}
					}
				}
				want := fmt.Sprintf("%s %s %s", tc.version, client, listen)
				headers := 1
				if tc.protocol == "udp" {
					headers = 3
				}
				for range headers {
					select {
					case got := <-pt.seen:
						if got != want {
							t.Fatalf("the target saw %q, want %q", got, want)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("the target saw no header")
					}
				}
			})
		}
	}
}

// A client cannot choose the address the target is told: a PROXY header it
// sends through the Tunnel is data after the exit's own, which names the
// address the entry saw. (Entries parse no PROXY headers: nothing in front
// of an entry is trusted to say who the client is.)
func TestClientCannotSetItsProxyAddress(t *testing.T) {
	// Through a chain, and through one relay with a rate limit, whose
	// flows are copied in user space rather than spliced.
	for _, tc := range []struct {
		name  string
		route []string
		extra string
	}{
		{"chain", []string{"r0", "r1"}, ""},
		{"one relay, rate-limited", []string{"r0"}, ", limits: {rateMbps: 100}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := tcpProxyTarget(t)
			port := testutil.FreePort(t)
			network(t, len(tc.route), tc.route, testutil.TunnelSpec{Name: "p", Protocol: "tcp", Target: pt.addr, Port: port, Extra: ", proxyProtocol: v1" + tc.extra})
			c := testutil.DialTunnel(t, port)
			defer c.Close()
			forged := fmt.Sprintf("PROXY TCP4 203.0.113.9 127.0.0.1 4242 %d\r\n", port)
			go func() { io.WriteString(c, forged+"hello"); c.CloseWrite() }()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil || string(got) != forged+"hello" {
				t.Fatalf("echo %q (%v): the client's bytes did not reach the target as data", got, err)
			}
			want := fmt.Sprintf("v1 %s 127.0.0.1:%d", c.LocalAddr(), port)
			select {
			case h := <-pt.seen:
				if h != want {
					t.Fatalf("the target was told %q, want %q", h, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the target saw no header")
			}
		})
	}
}

// IPv6 clients through relays that listen and dial on IPv6 only (::1): the
// target reads each client's IPv6 address and port and the Tunnel's
// address in the PROXY header, TCP6 in v1, AF_INET6 in v2, on TCP and on
// every UDP datagram, and the bytes after it intact.
func TestProxyProtocolIPv6(t *testing.T) {
	if c, err := net.Listen("tcp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	for _, tc := range []struct{ protocol, version string }{{"tcp", "v1"}, {"tcp", "v2"}, {"udp", "v2"}} {
		t.Run(tc.protocol+"/"+tc.version, func(t *testing.T) {
			seen := make(chan string, 16)
			var target string
			if tc.protocol == "tcp" {
				ln, err := net.Listen("tcp", "[::1]:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				go testutil.Serve(ln, func(c *net.TCPConn) {
					c.SetDeadline(time.Now().Add(20 * time.Second))
					r := bufio.NewReader(c)
					h, err := proxyproto.Read(r)
					if err != nil {
						seen <- "error: " + err.Error()
						return
					}
					seen <- fmt.Sprintf("v%d %s %s %s", h.Version, protoName(h.TransportProtocol), h.SourceAddr, h.DestinationAddr)
					io.Copy(c, r)
				})
				target = ln.Addr().String()
			} else {
				pc, err := net.ListenPacket("udp", "[::1]:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { pc.Close() })
				go func() {
					buf := make([]byte, 65536)
					for {
						n, from, err := pc.ReadFrom(buf)
						if err != nil {
							return
						}
						r := bufio.NewReader(bytes.NewReader(buf[:n]))
						h, err := proxyproto.Read(r)
						if err != nil {
							seen <- "error: " + err.Error()
							continue
						}
						seen <- fmt.Sprintf("v%d %s %s %s", h.Version, protoName(h.TransportProtocol), h.SourceAddr, h.DestinationAddr)
						payload, _ := io.ReadAll(r)
						pc.WriteTo(payload, from)
					}
				}()
				target = pc.LocalAddr().String()
			}
			port := testutil.FreePort(t)
			startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"}, Host: "::1",
				Tunnels: []testutil.TunnelSpec{{Name: "p", Protocol: tc.protocol, Target: target, Port: port, Extra: ", proxyProtocol: " + tc.version}}})
			listen := net.JoinHostPort("::1", fmt.Sprint(port))
			c, err := net.DialTimeout(tc.protocol, listen, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			payload := bytes.Repeat([]byte("hoplink6"), 125)
			headers, proto := 1, "TCP6"
			if tc.protocol == "tcp" {
				go func() { c.Write(payload); c.(*net.TCPConn).CloseWrite() }()
				got, err := io.ReadAll(c)
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("echo: %d of %d bytes intact (%v)", len(got), len(payload), err)
				}
			} else {
				headers, proto = 3, "UDP6"
				for i := range headers {
					if err := roundTrip(c.(*net.UDPConn), payload[:900+i]); err != nil {
						t.Fatalf("datagram %d: %v", i, err)
					}
				}
			}
			want := fmt.Sprintf("%s %s %s %s", tc.version, proto, c.LocalAddr(), listen)
			for range headers {
				select {
				case got := <-seen:
					if got != want {
						t.Fatalf("the target saw %q, want %q", got, want)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the target saw no header")
				}
			}
		})
	}
}

// protoName spells a header's transport as v1 does (TCP6), for UDP too.
func protoName(p proxyproto.AddressFamilyAndProtocol) string {
	name := "UDP"
	if p.IsStream() {
		name = "TCP"
	}
	switch {
	case p.IsIPv4():
		return name + "4"
	case p.IsIPv6():
		return name + "6"
	}
	return "UNSPEC"
}
