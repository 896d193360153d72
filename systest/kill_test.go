package systest

import (
	"context"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/faults"
	"github.com/hoplink/hoplink/internal/testing/procs"
)

// TestKillEachRelay kills (SIGKILL) each relay of a static three-relay
// chain, each relay its own process, over QUIC and over TLS, while a paced
// transfer goes up or down through it. Both applications, the client and
// the target, must see an error within 10 s: never a clean end of a short
// stream, which they would take for a complete one, and never nothing.
func TestKillEachRelay(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cases := faults.Cases(faults.Case{Size: 4 << 20, Pace: 3 * time.Second, KillAfter: time.Second})
	results := make([]faults.Result, len(cases))
	// Two cases at once, whatever -parallel says: each is four processes
	// and its verdict rests on timings.
	sem := make(chan struct{}, 2)
	t.Run("case", func(t *testing.T) {
		for i, c := range cases {
			t.Run(c.String(), func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				r, err := faults.Run(ctx, bin, dir, c)
				if err != nil {
					t.Fatalf("not measured: %v", err)
				}
				results[i] = r
				if r.Verdict() != faults.OK {
					t.Error(r.Detail())
				}
			})
		}
	})
	var measured []faults.Result
	for _, r := range results {
		if r.Case.Size != 0 {
			measured = append(measured, r)
		}
	}
	if t.Failed() {
		t.Errorf("a relay's crash must cost both ends an error within %v:\n%s", faults.Prompt, faults.Table(measured))
	} else {
		t.Logf("\n%s", faults.Table(measured))
	}
}
