package nexthop

import (
	"testing"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

const (
	overQUIC = v1alpha1.TransportQUIC
	overTLS  = v1alpha1.TransportTLS
)

func TestAutoChoosesPerLinkAndFlow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	bulk := func(c *chooser, peer, tunnel string, tr v1alpha1.Transport, mbps float64, now time.Time) {
		// 8 MiB at mbps Mbit/s.
		c.done(peer, tunnel, tr, 8<<20, 0, time.Duration(float64(8<<20)*8/(mbps*1e6)*float64(time.Second)), now)
	}
	type step struct {
		name   string
		do     func(c *chooser)
		peer   string
		tunnel string
		flow   bool
		sent   uint64
		lost   uint64
		want   v1alpha1.Transport
		reason string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"bulk flows take TLS before any measurement, lossy link or not", []step{
			{peer: "b", tunnel: "t", flow: true, want: overTLS, reason: ReasonUnmeasured},
			{peer: "c", tunnel: "t", flow: true, sent: 5000, lost: 100, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"packet sessions take QUIC on a lossy link", []step{
			{peer: "b", tunnel: "t", flow: false, sent: 5000, lost: 100, want: overQUIC, reason: ReasonLossy},
			// Too few packets to call the link lossy.
			{peer: "c", tunnel: "t", flow: false, sent: 10, lost: 5, want: overTLS, reason: ReasonUnmeasured},
			{peer: "d", tunnel: "t", flow: false, sent: 5000, lost: 10, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"TLS flows' retransmissions make a link lossy too", []step{
			{peer: "b", tunnel: "t", flow: true, want: overTLS, reason: ReasonUnmeasured},
			{do: func(c *chooser) { c.tcpLoss("b", 3000, 60) }, peer: "b", tunnel: "t", flow: false, sent: 100, want: overQUIC, reason: ReasonLossy},
			// Another link is not.
			{peer: "c", tunnel: "t", flow: false, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"short flows ride QUIC, others of the same link do not", []step{
			{name: "four 1 KiB flows", do: func(c *chooser) {
				for range shortFlows {
					c.done("b", "short", overTLS, 1024, 0, time.Millisecond, t0)
				}
			}, peer: "b", tunnel: "short", flow: true, want: overQUIC, reason: ReasonShort},
			{peer: "b", tunnel: "other", flow: true, want: overTLS, reason: ReasonUnmeasured},
			// A packet session is bulk whatever its Tunnel's flows were.
			{peer: "b", tunnel: "short", flow: false, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"interactive flows ride QUIC however long", []step{
			// 2 MB in 2,000 turns: seed 002's 1,000 echoes of 1,000 bytes.
			{do: func(c *chooser) {
				for range shortFlows {
					c.done("b", "rr", overTLS, 2e6, 2000, 10*time.Second, t0)
				}
			}, peer: "b", tunnel: "rr", flow: true, want: overQUIC, reason: ReasonInteractive},
			// They were no goodput samples: bulk still knows nothing.
			{peer: "b", tunnel: "bulk", flow: true, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"few short flows are not yet a shape", []step{
			{do: func(c *chooser) {
				for range shortFlows - 1 {
					c.done("b", "t", overTLS, 1024, 0, time.Millisecond, t0)
				}
			}, peer: "b", tunnel: "t", flow: true, want: overTLS, reason: ReasonUnmeasured},
		}},
		{"measured goodput decides, with a margin", []step{
			{do: func(c *chooser) {
				bulk(c, "b", "t", overTLS, 1000, t0)
				bulk(c, "b", "t", overTLS, 1000, t0)
				bulk(c, "b", "t", overQUIC, 3000, t0)
				bulk(c, "b", "t", overQUIC, 3000, t0)
			}, peer: "b", tunnel: "t", flow: true, want: overQUIC, reason: ReasonMeasured},
			// TLS gets better, but not by the margin: QUIC stays.
			{do: func(c *chooser) {
				for range 20 {
					bulk(c, "b", "t", overTLS, 3300, t0)
				}
			}, peer: "b", tunnel: "t", flow: true, want: overQUIC, reason: ReasonMeasured},
			// Then clearly faster: TLS.
			{do: func(c *chooser) {
				for range 20 {
					bulk(c, "b", "t", overTLS, 5000, t0)
				}
			}, peer: "b", tunnel: "t", flow: true, want: overTLS, reason: ReasonMeasured},
			// Measurement outranks a lossy link's prior.
			{peer: "b", tunnel: "t", flow: false, sent: 5000, lost: 250, want: overTLS, reason: ReasonMeasured},
		}},
		{"small flows are no goodput sample", []step{
			{do: func(c *chooser) {
				for range 10 {
					c.done("b", "t", overQUIC, 512<<10, 0, time.Millisecond, t0)
				}
			}, peer: "b", tunnel: "big", flow: true, want: overTLS, reason: ReasonUnmeasured},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChooser()
			for i, s := range tc.steps {
				if s.do != nil {
					s.do(c)
				}
				// The first pick of a link is never a sample.
				got, reason, _ := c.pick(s.peer, s.tunnel, s.flow, s.sent, s.lost, t0)
				if got != s.want || reason != s.reason {
					t.Fatalf("step %d %s: got %s (%s), want %s (%s)", i, s.name, got, reason, s.want, s.reason)
				}
			}
		})
	}
}

func TestAutoSamplesTheOtherTransport(t *testing.T) {
	c := newChooser()
	now := time.Unix(1000, 0)
	var sampled int
	for range 8 * sampleEvery {
		if tr, reason, _ := c.pick("b", "t", true, 0, 0, now); tr == overQUIC {
			if reason != ReasonSampling {
				t.Fatalf("overQUIC for %s", reason)
			}
			sampled++
		}
	}
	if sampled != 8 {
		t.Fatalf("%d of %d bulk flows sampled QUIC, want 8", sampled, 8*sampleEvery)
	}
	// Fresh figures for both: no more sampling until they are stale.
	for _, tr := range []v1alpha1.Transport{overQUIC, overQUIC, overTLS, overTLS} {
		c.done("b", "t", tr, 4<<20, 0, 10*time.Millisecond, now)
	}
	for range 4 * sampleEvery {
		if tr, reason, _ := c.pick("b", "t", true, 0, 0, now); reason != ReasonMeasured {
			t.Fatalf("with fresh figures: %s (%s)", tr, reason)
		}
	}
	var again bool
	for range sampleEvery {
		if _, reason, _ := c.pick("b", "t", true, 0, 0, now.Add(2*staleAfter)); reason == ReasonSampling {
			again = true
		}
	}
	if !again {
		t.Fatal("stale figures were not measured again")
	}
}

func TestAutoReportsChangesAndForgets(t *testing.T) {
	c := newChooser()
	var changes []string
	c.changed = func(peer string, from, to v1alpha1.Transport, reason string, _ map[v1alpha1.Transport]float64) {
		changes = append(changes, peer+":"+string(from)+">"+string(to)+":"+reason)
	}
	now := time.Unix(1000, 0)
	c.pick("b", "t", true, 0, 0, now)
	c.pick("b", "t", true, 0, 0, now)
	for _, tr := range []v1alpha1.Transport{overQUIC, overQUIC, overTLS, overTLS} {
		bps := 1.0
		if tr == overQUIC {
			bps = 2
		}
		c.done("b", "t", tr, 4<<20, 0, time.Duration(float64(time.Second)/bps), now)
	}
	c.pick("b", "t", true, 0, 0, now)
	if want := []string{"b:>tls:unmeasured", "b:tls>quic:measured"}; len(changes) != 2 || changes[0] != want[0] || changes[1] != want[1] {
		t.Fatalf("changes %q, want %q", changes, want)
	}
	c.forget(func(string) bool { return false })
	if tr, _ := c.current("b"); tr != "" {
		t.Fatalf("forgotten link still has %s", tr)
	}
}
