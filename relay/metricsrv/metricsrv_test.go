package metricsrv

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/srcaddr"
)

// start serves on a loopback port with lim.
func start(t *testing.T, lim limits) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := serve(ln, lim, prometheus.NewRegistry(), func() bool { return true }, false, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

// testLimits are short enough for a test, long enough for a busy host.
var testLimits = limits{conns: 32, readHeader: time.Second, read: 2 * time.Second, write: 2 * time.Second, idle: time.Second, profile: time.Minute}

// get sends one request on c and reads its answer, leaving c idle and open.
func get(c net.Conn, path string) (int, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: relay\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// closedWithin says whether the server closes c within d: a read sees the
// end (or a reset) rather than its deadline.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Each way of holding a connection without asking anything ends within its
// timeout (before: only a slow header did; an idle keep-alive connection
// stayed for good).
func TestConnectionsThatAskNothingAreClosed(t *testing.T) {
	_, addr := start(t, testLimits)
	for _, tc := range []struct {
		name string
		hold func(c net.Conn) error
	}{
		{"idle after a request", func(c net.Conn) error { _, err := get(c, "/healthz"); return err }},
		{"silent from the start", func(net.Conn) error { return nil }},
		{"a header byte a while", func(c net.Conn) error {
			_, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\n")
			go func() { // slower than any timeout, for longer than all
				for range 40 {
					if _, err := io.WriteString(c, "X"); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrom(t, "", addr)
			if err := tc.hold(c); err != nil {
				t.Fatal(err)
			}
			// Each bound is at most 2 s; 3 s more for a busy host.
			if !closedWithin(c, 5*time.Second) {
				t.Fatal("the connection is still open after 5 s")
			}
		})
	}
}

// Thousands of idle keep-alive connections leave the server holding at
// most its bound, and a probe from another host, or a new one from the
// flooding host, is answered (before: every one held, without bound).
func TestFloodIsBoundedAndProbesAnswer(t *testing.T) {
	lim := testLimits
	lim.idle = time.Minute // held by the bound alone, not the timeout
	s, addr := start(t, lim)
	const flood = 400
	var conns []net.Conn
	for range flood {
		c := dialFrom(t, "127.0.0.1", addr)
		if _, err := get(c, "/healthz"); err != nil {
			continue // closed to make room before it was answered
		}
		conns = append(conns, c)
	}
	if n := s.ln.open(); n > lim.conns {
		t.Fatalf("the server holds %d connections, more than its %d", n, lim.conns)
	}
	open := 0
	for _, c := range conns {
		if !closedWithin(c, 10*time.Millisecond) {
			open++
		}
	}
	if open > lim.conns {
		t.Fatalf("%d of %d flooding connections still open, more than %d", open, len(conns), lim.conns)
	}
	for _, from := range []string{"127.0.0.2", "127.0.0.1"} {
		c := dialFrom(t, from, addr)
		if code, err := get(c, "/readyz"); err != nil || code != http.StatusOK {
			t.Errorf("probe from %s under the flood: %d, %v", from, code, err)
		}
	}
}

// A connection of another host is not closed for the flood of one.
func TestFloodClosesItsOwnConnections(t *testing.T) {
	lim := testLimits
	lim.idle = time.Minute
	_, addr := start(t, lim)
	scraper := dialFrom(t, "127.0.0.2", addr)
	if _, err := get(scraper, "/metrics"); err != nil {
		t.Fatal(err)
	}
	for range 3 * lim.conns {
		get(dialFrom(t, "127.0.0.1", addr), "/healthz")
	}
	if code, err := get(scraper, "/metrics"); err != nil || code != http.StatusOK {
		t.Fatalf("the other host's keep-alive connection after the flood: %d, %v", code, err)
	}
}

func TestLargeHeadersAreRefused(t *testing.T) {
	_, addr := start(t, testLimits)
	c := dialFrom(t, "", addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	big := "GET /healthz HTTP/1.1\r\nHost: relay\r\nX: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"
	io.WriteString(c, big)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return // cut before an answer: refused too
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("64 KiB of headers: %d", resp.StatusCode)
	}
}

// The connection closed to make room: of the source holding the most, the
// one not in a request, the longest so; a busy one only when its source
// has no other.
func TestVictim(t *testing.T) {
	now := time.Now()
	type conn struct {
		src  string
		busy bool
		age  time.Duration
	}
	for _, tc := range []struct {
		name  string
		conns []conn
		want  int
	}{
		{"the heaviest source's", []conn{{"10.0.0.2", false, time.Hour}, {"10.0.0.1", false, 0}, {"10.0.0.1", false, time.Second}}, 2},
		{"idle before busy", []conn{{"10.0.0.1", true, time.Hour}, {"10.0.0.1", false, 0}}, 1},
		{"the longest idle", []conn{{"10.0.0.1", false, time.Second}, {"10.0.0.1", false, time.Minute}, {"10.0.0.1", false, 0}}, 1},
		{"an IPv6 /64 is one source", []conn{{"10.0.0.1", false, time.Hour}, {"2001:db8::1", false, 0}, {"2001:db8::2", false, time.Second}}, 2},
		{"busy when nothing is idle", []conn{{"10.0.0.1", true, time.Second}, {"10.0.0.1", true, time.Minute}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := newConnTable(nil, len(tc.conns))
			byConn := map[net.Conn]int{}
			for i, c := range tc.conns {
				p, _ := net.Pipe()
				src := srcaddr.Key(netip.MustParseAddr(c.src))
				tab.conns[p] = &connState{src: src, busy: c.busy, since: now.Add(-c.age)}
				tab.bySrc[src]++
				byConn[p] = i
			}
			if got := byConn[tab.victimLocked()]; got != tc.want {
				t.Fatalf("closes %d (%v), want %d (%v)", got, tc.conns[got], tc.want, tc.conns[tc.want])
			}
		})
	}
}
