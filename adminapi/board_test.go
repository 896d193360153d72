package adminapi

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
)

// A reader that holds the current version waits for the next one, and gets
// it as soon as it is set; one that holds nothing gets the current one at once.
func TestClusterSetWaitsForAChange(t *testing.T) {
	ca, _ := pki.NewCA("test")
	b := &backend{name: "la", board: NewBoard()}
	ep := server(t, ca, "la", b)
	c := operator(t, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, _, _, err := c.ClusterSet(ctx, "la", ep, "", 0); err == nil || !strings.Contains(err.Error(), "no_report") {
		t.Fatalf("an empty board: %v, want no_report", err)
	}
	b.board.Set([]byte("one"), "1")
	data, v, changed, err := c.ClusterSet(ctx, "la", ep, "", time.Second)
	if err != nil || string(data) != "one" || v != "1" || !changed {
		t.Fatalf("first read: %q %q %v %v", data, v, changed, err)
	}
	// Nothing new within the wait: not modified, after the wait.
	start := time.Now()
	data, v, changed, err = c.ClusterSet(ctx, "la", ep, "1", 300*time.Millisecond)
	if err != nil || changed || data != nil || v != "1" || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("unchanged read: %q %q %v %v after %s", data, v, changed, err, time.Since(start))
	}
	// A change during the wait ends it.
	go func() {
		time.Sleep(200 * time.Millisecond)
		b.board.Set([]byte("two"), "2")
	}()
	start = time.Now()
	data, v, changed, err = c.ClusterSet(ctx, "la", ep, "1", 10*time.Second)
	if err != nil || string(data) != "two" || v != "2" || !changed {
		t.Fatalf("read across a change: %q %q %v %v", data, v, changed, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the change took %s to reach a waiting reader", d)
	}
	if _, _, _, err := c.ClusterSet(ctx, "la", ep, "", MaxWait+time.Second); err == nil || !strings.Contains(err.Error(), "bad_wait") {
		t.Errorf("a wait past MaxWait: %v", err)
	}
}
