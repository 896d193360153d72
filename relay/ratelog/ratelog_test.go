package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestWarnIsBounded(t *testing.T) {
	var b bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&b, nil)))
	for range 1000 {
		l.Warn("rejected stream", "remote", "10.0.0.1:4444")
	}
	l.Warn("another message")
	if n := strings.Count(b.String(), "rejected stream"); n != Burst {
		t.Fatalf("%d lines of a flood, want %d", n, Burst)
	}
	if !strings.Contains(b.String(), "another message") {
		t.Fatal("one message's flood silenced another")
	}
	time.Sleep(Every + 50*time.Millisecond)
	b.Reset()
	l.Warn("rejected stream", "remote", "10.0.0.1:4444")
	if !strings.Contains(b.String(), "suppressed=995") || !strings.Contains(b.String(), "remote=10.0.0.1:4444") {
		t.Fatalf("the line after a flood: %q", b.String())
	}
}
