package tlslink

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/logs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// dialErrLines are the lines of log that say a peer cannot be reached.
func dialErrLines(log *testutil.Buffer) []string {
	var out []string
	for _, s := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if strings.Contains(s, "cannot reach peer") {
			out = append(out, s)
		}
	}
	return out
}

// A peer that is down, dialled at both its endpoints by four spares at
// once, attempt after attempt: the log says so in one line, each address's
// error once and with no line break in it, then one line with the count at
// the end of the window, not a line per attempt.
func TestPeerDownIsOneLineAWindow(t *testing.T) {
	var dead []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, ln.Addr().String())
		ln.Close()
	}
	ca, _ := pki.NewCA("test")
	id, err := ca.Identity("a")
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.Buffer
	lim := logs.NewLimiter(logs.Options{Window: time.Minute})
	e, err := Listen(Options{
		Name: "a", Identity: id, Listen: "127.0.0.1:0", Spares: refillParallel,
		Peers:   []string{"b"},
		Upper:   serveFunc(func(_ string, c *tls.Conn) { c.Close() }),
		Metrics: metrics.New(prometheus.NewRegistry()),
		Log:     slog.New(lim.Wrap(slog.NewTextHandler(&out, nil))),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Pools().Pool("b", dead)
	// Backoff doubles from 100 ms: five attempts or more in 2.5 s.
	time.Sleep(2500 * time.Millisecond)
	lines := dialErrLines(&out)
	if len(lines) != 1 {
		t.Fatalf("%d lines in 2.5 s, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	line := lines[0]
	if strings.Contains(line, `\n`) {
		t.Errorf("a line break in the line: %s", line)
	}
	for _, a := range dead {
		if n := strings.Count(line, a); n != 1 {
			t.Errorf("%s named %d times, want once: %s", a, n, line)
		}
	}
	if !strings.Contains(line, "(4 times)") {
		t.Errorf("the line does not say the four spares failed alike: %s", line)
	}
	lim.Flush()
	lines = dialErrLines(&out)
	if len(lines) != 2 || !strings.Contains(lines[1], "suppressed=") || !strings.Contains(lines[1], "window=1m0s") {
		t.Fatalf("after the window, want one line with the count:\n%s", strings.Join(lines, "\n"))
	}
}
