package logs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// clock is a fake time with the timers a Limiter schedules on it.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

type timer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// advance moves the clock and runs the timers due.
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
	kept := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			kept = append(kept, t)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

func newTest(keys int) (*slog.Logger, *Limiter, *clock, *bytes.Buffer) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var b bytes.Buffer
	l := NewLimiter(Options{Window: 10 * time.Second, Keys: keys, Now: c.Now, AfterFunc: c.AfterFunc})
	h := slog.NewJSONHandler(&b, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	return slog.New(l.Wrap(h)), l, c, &b
}

func records(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		delete(m, "level")
		out = append(out, m)
	}
	return out
}

func TestLimiter(t *testing.T) {
	type step struct {
		after time.Duration // the clock moves this much first
		log   func(*slog.Logger)
	}
	noRoute := func(tunnel string, port int) func(*slog.Logger) {
		return func(l *slog.Logger) { l.Warn("no route for flow", "tunnel", tunnel, "port", port) }
	}
	times := func(n int, f func(*slog.Logger)) func(*slog.Logger) {
		return func(l *slog.Logger) {
			for range n {
				f(l)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string // each line's JSON, without time and level
	}{{
		name:  "one line passes",
		steps: []step{{0, noRoute("a/t", 1)}},
		want:  []string{`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`},
	}, {
		name:  "a flood is its first line, then the last with a count at the window's end",
		steps: []step{{0, times(200, noRoute("a/t", 1))}, {0, noRoute("a/t", 2)}, {10 * time.Second, nil}},
		want: []string{
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
			`{"msg":"no route for flow","port":2,"suppressed":200,"tunnel":"a/t","window":"10s"}`,
		},
	}, {
		name:  "a second line in a window comes at its end, counted: it is not news",
		steps: []step{{0, noRoute("a/t", 1)}, {time.Second, noRoute("a/t", 2)}, {9 * time.Second, nil}},
		want: []string{
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
			`{"msg":"no route for flow","port":2,"suppressed":1,"tunnel":"a/t","window":"10s"}`,
		},
	}, {
		name: "a steady flood is one line a window",
		steps: []step{
			{0, times(50, noRoute("a/t", 1))},
			{5 * time.Second, times(50, noRoute("a/t", 1))},
			{5 * time.Second, times(50, noRoute("a/t", 1))},
			{10 * time.Second, times(50, noRoute("a/t", 1))},
			{10 * time.Second, nil},
		},
		want: []string{
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
			`{"msg":"no route for flow","port":1,"suppressed":99,"tunnel":"a/t","window":"10s"}`,
			`{"msg":"no route for flow","port":1,"suppressed":50,"tunnel":"a/t","window":"10s"}`,
			`{"msg":"no route for flow","port":1,"suppressed":50,"tunnel":"a/t","window":"10s"}`,
		},
	}, {
		name:  "after a quiet window the next line passes at once",
		steps: []step{{0, noRoute("a/t", 1)}, {30 * time.Second, noRoute("a/t", 1)}},
		want: []string{
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
		},
	}, {
		name:  "string values name the condition: other tunnels are other lines",
		steps: []step{{0, noRoute("a/t", 1)}, {0, noRoute("a/u", 1)}, {0, noRoute("a/t", 1)}},
		want: []string{
			`{"msg":"no route for flow","port":1,"tunnel":"a/t"}`,
			`{"msg":"no route for flow","port":1,"tunnel":"a/u"}`,
		},
	}, {
		name: "other messages and levels are other conditions",
		steps: []step{{0, func(l *slog.Logger) {
			l.Warn("x", "k", "v")
			l.Error("x", "k", "v")
			l.Warn("y", "k", "v")
			l.Warn("x", "k", "v")
		}}},
		want: []string{`{"k":"v","msg":"x"}`, `{"k":"v","msg":"x"}`, `{"k":"v","msg":"y"}`},
	}, {
		name: "an event writes what was held back first: no line comes after the event that replaced it",
		steps: []step{{0, func(l *slog.Logger) {
			l.Error("manifests rejected; keeping the current ones", "err", "spec.targte")
			l.Error("manifests rejected; keeping the current ones", "err", "spec.targte")
			l.Info("manifests reloaded", "signal", true)
		}}, {10 * time.Second, nil}},
		want: []string{
			`{"err":"spec.targte","msg":"manifests rejected; keeping the current ones"}`,
			`{"err":"spec.targte","msg":"manifests rejected; keeping the current ones","suppressed":1,"window":"10s"}`,
			`{"msg":"manifests reloaded","signal":true}`,
		},
	}, {
		name: "info lines are events, each written",
		steps: []step{{0, func(l *slog.Logger) {
			l.Info("manifests reloaded", "signal", true)
			l.Info("manifests reloaded", "signal", true)
			l.Debug("probe sent", "to", "la")
		}}},
		want: []string{`{"msg":"manifests reloaded","signal":true}`, `{"msg":"manifests reloaded","signal":true}`},
	}, {
		name: "attributes of With name the condition too",
		steps: []step{{0, func(l *slog.Logger) {
			l.With("peer", "hk").Warn("cannot reach peer", "retry_in", time.Second)
			l.With("peer", "la").Warn("cannot reach peer", "retry_in", time.Second)
			l.With("peer", "hk").Warn("cannot reach peer", "retry_in", 2*time.Second)
			l.WithGroup("g").With("peer", "hk").Warn("cannot reach peer")
		}}},
		want: []string{
			`{"msg":"cannot reach peer","peer":"hk","retry_in":1000000000}`,
			`{"msg":"cannot reach peer","peer":"la","retry_in":1000000000}`,
			`{"g":{"peer":"hk"},"msg":"cannot reach peer"}`,
		},
	}, {
		name: "errors and strings lose their line breaks",
		steps: []step{{0, func(l *slog.Logger) {
			l.Warn("cannot reach peer", "err", errors.Join(errors.New("dial tcp a: refused"), errors.New("dial tcp b: refused")))
			l.Warn("two\nlines", "s", "x\r\n  y\n")
			l.Warn("grouped", slog.Group("g", "err", fmt.Errorf("a\nb")))
		}}},
		want: []string{
			`{"err":"dial tcp a: refused; dial tcp b: refused","msg":"cannot reach peer"}`,
			`{"msg":"two; lines","s":"x; y"}`,
			`{"g":{"err":"a; b"},"msg":"grouped"}`,
		},
	}, {
		name: "a value has one type: addresses are text, no list is null",
		steps: []step{{0, func(l *slog.Logger) {
			l.Info("peer connected", "remote", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7401})
			l.Info("relay started", "peers", []string(nil))
			l.Info("relay started", "peers", []string{"la"}, "err", error(nil), "addr", (*net.UDPAddr)(nil))
		}}},
		want: []string{
			`{"msg":"peer connected","remote":"127.0.0.1:7401"}`,
			`{"msg":"relay started","peers":[]}`,
			`{"addr":null,"err":null,"msg":"relay started","peers":["la"]}`,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			log, _, c, b := newTest(100)
			for _, s := range tc.steps {
				c.advance(s.after)
				if s.log != nil {
					s.log(log)
				}
			}
			got := records(t, b)
			if len(got) != len(tc.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(got), len(tc.want), b)
			}
			for i, w := range tc.want {
				g, _ := json.Marshal(got[i])
				if string(g) != w {
					t.Errorf("line %d: %s, want %s", i, g, w)
				}
			}
		})
	}
}

// The table is bounded: past Keys conditions the oldest is forgotten, and
// what it had left out is written then rather than lost.
func TestLimiterIsBounded(t *testing.T) {
	log, l, _, b := newTest(8)
	log.Warn("no route for flow", "tunnel", "t0")
	log.Warn("no route for flow", "tunnel", "t0")
	log.Warn("no route for flow", "tunnel", "t0")
	for i := range 1000 {
		log.Warn("no route for flow", "tunnel", fmt.Sprint("t", i+1))
	}
	if n := l.Len(); n != 8 {
		t.Fatalf("%d conditions remembered, want 8", n)
	}
	rs := records(t, b)
	if len(rs) != 1002 {
		t.Fatalf("%d lines, want 1002", len(rs))
	}
	// t0..t7 fill the table; t8 pushes t0 out, which writes its count.
	if rs[8]["tunnel"] != "t0" || rs[8]["suppressed"] != 2.0 || rs[9]["tunnel"] != "t8" {
		t.Errorf("the evicted condition's count: %v, then %v", rs[8], rs[9])
	}
}

// Flush writes what is pending, for a process about to exit.
func TestFlush(t *testing.T) {
	log, l, _, b := newTest(8)
	for range 5 {
		log.Error("cannot start", "err", "port in use")
	}
	l.Flush()
	rs := records(t, b)
	if len(rs) != 2 || rs[1]["suppressed"] != 4.0 {
		t.Fatalf("after Flush: %s", b)
	}
}

// Many goroutines logging at once (run with -race) lose no condition's
// first line and write no more than the first and one count each.
func TestLimiterConcurrent(t *testing.T) {
	var b testutil.Buffer
	l := NewLimiter(Options{Window: time.Hour})
	log := slog.New(l.Wrap(slog.NewTextHandler(&b, nil)))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				log.Warn("no route for flow", "tunnel", fmt.Sprint("t", i%4), "g", g%2 == 0)
			}
		}()
	}
	wg.Wait()
	l.Flush()
	lines := strings.Count(b.String(), "\n")
	if lines != 16 {
		t.Fatalf("%d lines, want 16 (8 conditions, each a first line and a count):\n%s", lines, b.String())
	}
}

// The line that ends a window carries the time it is written: lines stay in
// time order.
func TestCountLineIsStampedWhenWritten(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var b bytes.Buffer
	l := NewLimiter(Options{Window: 10 * time.Second, Now: c.Now, AfterFunc: c.AfterFunc})
	log := slog.New(l.Wrap(slog.NewJSONHandler(&b, nil)))
	for range 3 {
		r := slog.NewRecord(c.Now(), slog.LevelWarn, "no route for flow", 0)
		log.Handler().Handle(context.Background(), r)
		c.advance(time.Second)
	}
	c.advance(7 * time.Second) // to the end of the window that began at 0
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], `"time":"2026-01-01T00:00:10Z"`) {
		t.Fatalf("want the count line at the window's end, 00:00:10:\n%s", b.String())
	}
}
