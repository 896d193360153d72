package systest

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/seed004"
)

// TestSeed004Scenario runs the network of seed 004 (internal/testing/seed004: four
// relay processes in four namespaces over emulated links with the report's
// round trips) and checks that sum and pipe chains each take the route the
// link latencies imply, carry requests within 5% of its theoretical latency
// at p50, move within two probe intervals when a link on the route degrades
// without failing one open flow, and leave a route at once when a relay on
// it dies.
func TestSeed004Scenario(t *testing.T) {
	requireNetns(t)
	const interval = 1500 * time.Millisecond
	dir := t.TempDir()
	o := seed004.Options{Hoplink: procs.Hoplink(t), Dir: dir, Prefix: fmt.Sprintf("hs%d", os.Getpid()%100000), Interval: interval}
	n, err := seed004.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		if t.Failed() {
			for _, r := range seed004.Relays {
				b, _ := os.ReadFile(n.LogFile(dir, r))
				t.Logf("--- %s log:\n%s", r, b)
			}
		}
	})
	chains := map[string]string{seed004.Sum: seed004.SumAddr, seed004.Pipe: seed004.PipeAddr}
	waitRoute := func(relay, chain, want string, within time.Duration) time.Duration {
		t.Helper()
		took, err := n.WaitRoute(relay, chain, want, within)
		if err != nil {
			t.Fatal(err)
		}
		return took
	}
	// movedWithin waits for both chains to take route after an event at
	// since, and checks they did within two probe intervals of it.
	movedWithin := func(what, route string, since time.Time) {
		t.Helper()
		for chain := range chains {
			waitRoute("hk", chain, route, 4*interval)
			took := time.Since(since)
			t.Logf("%s moved to %s %v after %s", chain, route, took.Round(time.Millisecond), what)
			if took > 2*interval {
				t.Errorf("%s moved %v after %s; want within two probe intervals (%v)", chain, took, what, 2*interval)
			}
		}
	}

	// hk -> la -> useast: 152 + 69 = 221 ms, the cheapest of
	// hk -> seattle -> la -> useast (253) and hk -> useast (299).
	for chain := range chains {
		waitRoute("hk", chain, "hk,la,useast", 30*time.Second)
	}
	checkP50 := func(what string, theory time.Duration) {
		var wg sync.WaitGroup
		for chain, addr := range chains {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, failed := n.Run(addr, seed004.Load{Clients: 4, Requests: 12})
				p := seed004.Quantile(got, .5)
				switch {
				case failed > 0:
					t.Errorf("%s, %s: %d of 4 clients failed", chain, what, failed)
				case p < theory || p > theory*105/100:
					t.Errorf("%s, %s: p50 %v; theoretical %v (within 5%%: up to %v)", chain, what, p, theory, theory*105/100)
				default:
					t.Logf("%s, %s: p50 %v for theoretical %v (+%.1f%%)", chain, what, p.Round(10*time.Microsecond), theory, 100*float64(p-theory)/float64(theory))
				}
			}()
		}
		wg.Wait()
	}
	checkP50("via la", 221*time.Millisecond)
	// The relays on the route know it too.
	for chain := range chains {
		for _, relay := range []string{"la", "useast"} {
			waitRoute(relay, chain, "hk,la,useast", 3*interval)
		}
	}

	// Flows open across the move keep exchanging requests; none may fail.
	var failed, done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, addr := range chains {
		for range 4 {
			c, err := n.Dial("hk", addr)
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 64)
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err := c.Write(buf); err != nil {
						failed.Add(1)
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						failed.Add(1)
						return
					}
					done.Add(1)
				}
			}()
		}
	}
	time.Sleep(500 * time.Millisecond)

	// hk-la degrades from 152 to 252 ms: hk -> la -> useast costs 321 ms
	// now, and hk -> seattle -> la -> useast (253) is the best.
	n.Links["hk-la"].Set(linkemu.Params{Delay: 126 * time.Millisecond})
	movedWithin("hk-la degraded", "hk,seattle,la,useast", time.Now())
	checkP50("via seattle and la", 253*time.Millisecond)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 8 flows open during the move failed", n)
	}
	t.Logf("8 flows open across the move answered %d requests, none failed", done.Load())

	// seattle dies: the route through it is left at the next round, without
	// the hysteresis, for the best that remains (hk -> useast, 299 ms).
	n.Relay("seattle").Kill()
	movedWithin("seattle died", "hk,useast", time.Now())
	checkP50("direct", 299*time.Millisecond)
}
