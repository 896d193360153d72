package tlslink

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/eyeballs"
)

// A peer published on both families gets its TLS connections on whichever
// answers, IPv6 first: an IPv6 endpoint that refuses costs nothing, one
// that takes the TCP connection and never answers the handshake (a
// middlebox, another service on the port) costs one Delay, not the 5 s
// handshake timeout.
func TestPoolDialsTheFamilyThatAnswers(t *testing.T) {
	if c, err := net.Listen("tcp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	ca, _ := pki.NewCA("test")
	listen := func(name, addr string) *Endpoint {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		e, err := Listen(Options{Name: name, Identity: id, Listen: addr, Peers: []string{"a", "b"},
			Upper:   serveFunc(func(_ string, c *tls.Conn) { c.Close() }),
			Metrics: metrics.New(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	b := listen("b", ":0") // dual-stack: ::1 and 127.0.0.1 reach it
	port := strconv.Itoa(b.Addr().(*net.TCPAddr).Port)
	v6, v4 := net.JoinHostPort("::1", port), net.JoinHostPort("127.0.0.1", port)
	refused := func(host string) string {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	// silent accepts TCP connections and says nothing.
	silent := func(host string) string {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
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
				t.Cleanup(func() { c.Close() })
			}
		}()
		return ln.Addr().String()
	}
	for _, tc := range []struct {
		name   string
		eps    []string
		family string
		within time.Duration
	}{
		{"both answer: ipv6 preferred", []string{v4, v6}, eyeballs.IPv6, time.Second},
		{"ipv6 refused: ipv4 at once", []string{refused("::1"), v4}, eyeballs.IPv4, time.Second},
		{"ipv6 silent: ipv4 a delay later", []string{silent("::1"), v4}, eyeballs.IPv4, eyeballs.Delay + time.Second},
		{"ipv4 silent: ipv6", []string{silent("127.0.0.1"), v6}, eyeballs.IPv6, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := listen("a", "127.0.0.1:0") // a pool per peer name: one a per case
			p := a.Pools().Pool("b", tc.eps)
			ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
			defer cancel()
			start := time.Now()
			c, err := p.dial(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if took := time.Since(start); took > tc.within {
				t.Errorf("connected after %v, want within %v", took, tc.within)
			}
			if got := eyeballs.FamilyOf(c.RemoteAddr()); got != tc.family {
				t.Errorf("connected to %v (%s), want %s", c.RemoteAddr(), got, tc.family)
			}
		})
	}
}
