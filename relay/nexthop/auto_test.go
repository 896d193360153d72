package nexthop

import (
	"testing"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
)

const (
	overQUIC = v1alpha1.TransportQUIC
	overTLS  = v1alpha1.TransportTLS
)

// linkShows is what a link's connections show of its loss; asked, when
// set, is told each question.
type linkShows struct {
	quicSent, quicLost uint64
	tlsSent, tlsLost   uint64 // of the open TLS flows
	rtt                time.Duration
	asked              *int
}

func (l linkShows) RTT() time.Duration { return l.rtt }

func (l linkShows) QUIC() (uint64, uint64) {
	if l.asked != nil {
		*l.asked++
	}
	return l.quicSent, l.quicLost
}

func (l linkShows) OpenTLS() (uint64, uint64) {
	if l.asked != nil {
		*l.asked++
	}
	return l.tlsSent, l.tlsLost
}

// lossOf is a link whose QUIC connections sent and lost packets.
func lossOf(sent, lost uint64) linkShows { return linkShows{quicSent: sent, quicLost: lost} }

var noLoss = linkShows{}

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
			{name: "four bulk flows", do: func(c *chooser) {
				for range shortFlows {
					bulk(c, "c", "t", overTLS, 1000, t0)
				}
			}, peer: "c", tunnel: "t", flow: true, sent: 5000, lost: 100, want: overTLS, reason: ReasonUnmeasured},
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
				got, reason, _ := c.pick(s.peer, s.tunnel, s.flow, nil, lossOf(s.sent, s.lost), t0)
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
		if tr, reason, _ := c.pick("b", "t", true, nil, noLoss, now); tr == overQUIC {
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
		if tr, reason, _ := c.pick("b", "t", true, nil, noLoss, now); reason != ReasonMeasured {
			t.Fatalf("with fresh figures: %s (%s)", tr, reason)
		}
	}
	var again bool
	for range sampleEvery {
		if _, reason, _ := c.pick("b", "t", true, nil, noLoss, now.Add(2*staleAfter)); reason == ReasonSampling {
			again = true
		}
	}
	if !again {
		t.Fatal("stale figures were not measured again")
	}
}

// On a long lossy link a QUIC sample could not win against what TLS
// already carried, and would cost its bulk flow most of its life: it is
// not taken. A link whose loss would let QUIC keep up is sampled as before.
func TestAutoSamplesOnlyWhatCouldWin(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name    string
		link    linkShows
		tlsMbps float64
		sample  bool
	}{
		{"152 ms, 1% loss, tls at 60 Mbit/s", linkShows{quicSent: 100000, quicLost: 1000, rtt: 152 * time.Millisecond}, 60, false},
		{"152 ms, 1% loss, tls at 1 Mbit/s", linkShows{quicSent: 100000, quicLost: 1000, rtt: 152 * time.Millisecond}, 1, true},
		{"1 ms, 0.1% loss, tls at 900 Mbit/s", linkShows{quicSent: 100000, quicLost: 100, rtt: time.Millisecond}, 900, true},
		{"no loss seen", linkShows{quicSent: 100000, rtt: 152 * time.Millisecond}, 60, true},
		{"round trip unknown", linkShows{quicSent: 100000, quicLost: 1000}, 60, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChooser()
			c.done("b", "t", overTLS, 8<<20, 0, time.Duration(float64(8<<20)*8/(tc.tlsMbps*1e6)*float64(time.Second)), now)
			sampled := 0
			for range 4 * sampleEvery {
				if _, reason, _ := c.pick("b", "t", true, nil, tc.link, now); reason == ReasonSampling {
					sampled++
				}
			}
			if got := sampled > 0; got != tc.sample {
				t.Fatalf("sampled QUIC %d times in %d bulk flows, want sampling %v", sampled, 4*sampleEvery, tc.sample)
			}
		})
	}
}

func TestAutoReportsChangesAndForgets(t *testing.T) {
	c := newChooser()
	var changes []string
	c.changed = func(peer string, from, to v1alpha1.Transport, reason string, _ map[v1alpha1.Transport]float64) {
		changes = append(changes, peer+":"+string(from)+">"+string(to)+":"+reason)
	}
	now := time.Unix(1000, 0)
	c.pick("b", "t", true, nil, noLoss, now)
	c.pick("b", "t", true, nil, noLoss, now)
	for _, tr := range []v1alpha1.Transport{overQUIC, overQUIC, overTLS, overTLS} {
		bps := 1.0
		if tr == overQUIC {
			bps = 2
		}
		c.done("b", "t", tr, 4<<20, 0, time.Duration(float64(time.Second)/bps), now)
	}
	c.pick("b", "t", true, nil, noLoss, now)
	if want := []string{"b:>tls:unmeasured", "b:tls>quic:measured"}; len(changes) != 2 || changes[0] != want[0] || changes[1] != want[1] {
		t.Fatalf("changes %q, want %q", changes, want)
	}
	c.forget(func(string) bool { return false })
	if tr, _ := c.current("b"); tr != "" {
		t.Fatalf("forgotten link still has %s", tr)
	}
}

func TestAutoUnknownShapeRidesQUICOnALossyLink(t *testing.T) {
	now := time.Unix(1000, 0)
	type pick struct {
		want   v1alpha1.Transport
		reason string
		bulk   bool
	}
	checkFlow := func(t *testing.T, c *chooser, peer, tunnel string, m progress, loss linkLoss, want pick) {
		t.Helper()
		tr, reason, bulk := c.pick(peer, tunnel, true, m, loss, now)
		if got := (pick{tr, reason, bulk}); got != want {
			t.Fatalf("%s of %s: got %+v, want %+v", tunnel, peer, got, want)
		}
	}
	check := func(t *testing.T, c *chooser, peer, tunnel string, loss linkLoss, want pick) {
		t.Helper()
		checkFlow(t, c, peer, tunnel, nil, loss, want)
	}
	quic := pick{overQUIC, ReasonLossy, false}
	tls := pick{overTLS, ReasonUnmeasured, false}
	tlsBulk := pick{overTLS, ReasonUnmeasured, true}
	lossy := lossOf(5000, 10) // 0.2%

	t.Run("what the link lost decides", func(t *testing.T) {
		c := newChooser()
		check(t, c, "b", "t", lossy, quic)
		// As clean links always did: TLS from a spare.
		check(t, c, "b", "t", noLoss, tls)
		// One loss may be a stray one.
		check(t, c, "b", "t", lossOf(100, 1), tls)
		check(t, c, "b", "t", lossOf(5000, 4), tls)
		// What a link's TLS flows retransmitted counts too.
		c.tcpLoss("c", 3000, 6)
		check(t, c, "c", "t", lossOf(100, 0), quic)
		// So does the link of three that lose 1% end to end.
		check(t, c, "d", "t", lossOf(3000, 10), quic)
		// Bulk TLS flows' many segments do not drown QUIC's loss.
		c.tcpLoss("e", 1<<20, 100)
		check(t, c, "e", "t", lossOf(600, 3), quic)
		// TLS flows still open show it too: a link's only flows may end
		// late or never.
		check(t, c, "f", "t", linkShows{quicSent: 600, tlsSent: 2000, tlsLost: 6}, quic)
		// What is asked is asked only as far as needed.
		asked := 0
		check(t, c, "f", "t", linkShows{quicSent: 600, quicLost: 3, asked: &asked}, quic)
		if asked != 1 {
			t.Fatalf("%d questions to a link whose QUIC counts said enough, want 1", asked)
		}
	})
	t.Run("one bulk flow says enough", func(t *testing.T) {
		c := newChooser()
		// 8 MiB one way over QUIC, the transport the guess gave it.
		c.done("b", "t", overQUIC, 8<<20, 1, time.Second, now)
		check(t, c, "b", "t", lossy, tlsBulk)
		// The Tunnel turned out to do requests and answers after all.
		c.done("b", "t", overTLS, 2e6, 2000, 10*time.Second, now)
		check(t, c, "b", "t", lossy, quic)
	})
	t.Run("an open flow that moved bulk says enough", func(t *testing.T) {
		c := newChooser()
		first, second := &moved{}, &moved{}
		checkFlow(t, c, "b", "t", first, lossy, quic)
		checkFlow(t, c, "b", "t", second, lossy, quic)
		// A request and 512 KiB of answer so far: not yet.
		first.bytes, first.turns = 512<<10, 1
		check(t, c, "b", "t", lossy, quic)
		// Requests and answers, however many bytes.
		second.bytes, second.turns = 4<<20, 4000
		check(t, c, "b", "t", lossy, quic)
		// 2 MiB of answer: the Tunnel's next flows take the bulk transport.
		first.bytes = 2 << 20
		check(t, c, "b", "t", lossy, tlsBulk)
		// Another Tunnel's guess stands.
		check(t, c, "b", "u", lossy, quic)
		// The flow ended without saying more (a reset): it is no longer
		// watched.
		c.unwatch("t", first)
		check(t, c, "b", "t", lossy, quic)
	})
	t.Run("the newest open flows are watched", func(t *testing.T) {
		c := newChooser()
		old := &moved{}
		checkFlow(t, c, "b", "t", old, lossy, quic)
		for range watchFlows {
			checkFlow(t, c, "b", "t", &moved{}, lossy, quic)
		}
		old.bytes = 8 << 20
		check(t, c, "b", "t", lossy, quic)
		if n := len(c.watched["t"]); n != watchFlows {
			t.Fatalf("%d flows watched, want %d", n, watchFlows)
		}
	})
	t.Run("flows that say little leave the guess", func(t *testing.T) {
		c := newChooser()
		// Requests and answers; a small flow; 900 KiB one way.
		c.done("b", "rr", overQUIC, 2e6, 2000, time.Second, now)
		c.done("b", "small", overQUIC, 10<<10, 1, time.Millisecond, now)
		c.done("b", "mid", overQUIC, 900<<10, 0, time.Millisecond, now)
		for _, tunnel := range []string{"rr", "small", "mid"} {
			check(t, c, "b", tunnel, lossy, quic)
		}
	})
	t.Run("known shapes keep their transport", func(t *testing.T) {
		c := newChooser()
		for range shortFlows {
			c.done("b", "bulk", overTLS, 8<<20, 0, time.Second, now)
			c.done("b", "rr", overTLS, 2e6, 2000, 10*time.Second, now)
		}
		asked := 0
		shows := lossy
		shows.asked = &asked
		check(t, c, "b", "bulk", shows, tlsBulk)
		check(t, c, "b", "rr", shows, pick{overQUIC, ReasonInteractive, false})
		if asked != 0 {
			t.Fatal("a known Tunnel's flow asked for the link's loss")
		}
	})
}

// moved is an open flow's progress.
type moved struct{ bytes, turns int64 }

func (m *moved) Bytes() int64 { return m.bytes }
func (m *moved) Turns() int64 { return m.turns }

// Where QUIC's loss-based congestion control would bind a bulk flow far
// far more than TCP's retransmission timeouts would slow requests, a flow
// of unknown shape does not ride QUIC for a guess: its life may be one long
// bulk transfer. Where QUIC would still be fast or TCP's timeout is many
// round trips (a LAN), or the round trip is unknown, the guess stands.
func TestAutoUnknownShapeTakesTLSWhereQUICWouldBind(t *testing.T) {
	now := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		link    linkShows
		tcp     [2]uint32 // finished TLS flows' segments sent, retransmitted
		tlsMbps float64   // what TLS flows of another Tunnel carried, 0: none
		want    v1alpha1.Transport
		reason  string
		bulk    bool
	}{
		{"152 ms, 1% loss", linkShows{quicSent: 2000, quicLost: 20, rtt: 152 * ms}, [2]uint32{}, 0, overTLS, ReasonLossBound, true},
		{"32 ms, 0.1% loss", linkShows{quicSent: 5000, quicLost: 5, rtt: 32 * ms}, [2]uint32{}, 0, overTLS, ReasonLossBound, true},
		{"152 ms, loss only in TLS flows' retransmissions", linkShows{quicSent: 300, rtt: 152 * ms}, [2]uint32{4000, 12}, 0, overTLS, ReasonLossBound, true},
		{"152 ms, loss in open TLS flows", linkShows{quicSent: 300, tlsSent: 4000, tlsLost: 40, rtt: 152 * ms}, [2]uint32{}, 0, overTLS, ReasonLossBound, true},
		{"20 ms, 1% loss", linkShows{quicSent: 2000, quicLost: 20, rtt: 20 * ms}, [2]uint32{}, 0, overTLS, ReasonLossBound, true},
		{"1 ms, 1% loss", linkShows{quicSent: 2000, quicLost: 20, rtt: ms}, [2]uint32{}, 0, overQUIC, ReasonLossy, false},
		{"1 ms, 0.1% loss", linkShows{quicSent: 5000, quicLost: 5, rtt: ms}, [2]uint32{}, 0, overQUIC, ReasonLossy, false},
		{"4 ms, 5% loss: a request's timeout is 50 round trips", linkShows{quicSent: 2000, quicLost: 100, rtt: 4 * ms}, [2]uint32{}, 0, overQUIC, ReasonLossy, false},
		{"152 ms, 1% loss, TLS carried only 1 Mbit/s", linkShows{quicSent: 2000, quicLost: 20, rtt: 152 * ms}, [2]uint32{}, 1, overQUIC, ReasonLossy, false},
		{"152 ms, 1% loss, TLS carried 60 Mbit/s", linkShows{quicSent: 2000, quicLost: 20, rtt: 152 * ms}, [2]uint32{}, 60, overTLS, ReasonLossBound, true},
		{"round trip unknown", linkShows{quicSent: 2000, quicLost: 20}, [2]uint32{}, 0, overQUIC, ReasonLossy, false},
		{"152 ms, no loss", linkShows{quicSent: 2000, rtt: 152 * ms}, [2]uint32{}, 0, overTLS, ReasonUnmeasured, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChooser()
			if tc.tcp[0] > 0 {
				c.tcpLoss("b", tc.tcp[0], tc.tcp[1])
			}
			if tc.tlsMbps > 0 {
				c.done("b", "other", overTLS, 8<<20, 0, time.Duration(float64(8<<20)*8/(tc.tlsMbps*1e6)*float64(time.Second)), now)
			}
			tr, reason, bulk := c.pick("b", "t", true, &moved{}, tc.link, now)
			if tr != tc.want || reason != tc.reason || bulk != tc.bulk {
				t.Fatalf("got %s (%s, bulk %v), want %s (%s, bulk %v)", tr, reason, bulk, tc.want, tc.reason, tc.bulk)
			}
		})
	}
}

// TestAutoShapePerTarget: a flow-mode tun Tunnel carries flows to many
// targets; echoes to one must not make a bulk flow to another ride QUIC
// as short, while a TCP Tunnel (one target) learns as before.
func TestAutoShapePerTarget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newChooser()
	echo := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/site", Target: "10.77.0.1:7000"}
	sink := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/site", Target: "10.77.0.1:7001"}
	for range shortFlows {
		c.done("b", shapeKey(echo), overQUIC, 4000, 8, time.Second, t0)
	}
	if got, reason, _ := c.pick("b", shapeKey(echo), true, nil, noLoss, t0); got != overQUIC || reason != ReasonShort {
		t.Errorf("echo target: %s (%s), want quic (%s)", got, reason, ReasonShort)
	}
	if got, reason, _ := c.pick("b", shapeKey(sink), true, nil, noLoss, t0); got != overTLS || reason != ReasonUnmeasured {
		t.Errorf("another target of the Tunnel: %s (%s), want tls (%s), not the echoes' shape", got, reason, ReasonUnmeasured)
	}
	if a, b := shapeKey(echo), shapeKey(&hop.Header{Kind: hop.KindTCP, Tunnel: "default/site", Target: "10.77.0.1:7000"}); a != b {
		t.Errorf("one Tunnel and target, two keys: %q, %q", a, b)
	}
	if k := shapeKey(&hop.Header{Kind: hop.KindTCP, Tunnel: "default/t"}); k != "default/t" {
		t.Errorf("no target: key %q, want the Tunnel's", k)
	}
}

// A Tunnel whose flows live long in requests and answers rides TLS on a
// short link that shows no loss, worth a handshake; on a long link, one
// whose round trip is not known, or one that loses packets, it keeps QUIC,
// as do Tunnels whose flows turn only a few times.
func TestAutoLongInteractiveFlowsRideTLSOnAShortCleanLink(t *testing.T) {
	now := time.Unix(1000, 0)
	const lan = 500 * time.Microsecond
	for _, tc := range []struct {
		name   string
		bytes  int64 // per flow
		turns  int64 // per flow
		link   linkShows
		want   v1alpha1.Transport
		reason string
		handsh bool // worth a handshake
	}{
		{"kept-alive small requests, LAN", 20 << 10, 320, linkShows{rtt: lan}, overTLS, ReasonLongInteractive, true},
		{"long session of big answers, LAN", 8 << 20, 400, linkShows{rtt: lan}, overTLS, ReasonLongInteractive, true},
		{"at the bar", 4 << 10, longTurns, linkShows{rtt: shortLinkRTT}, overTLS, ReasonLongInteractive, true},
		{"one request per flow", 4 << 10, 2, linkShows{rtt: lan}, overQUIC, ReasonShort, false},
		{"just under the bar", 4 << 10, longTurns - 1, linkShows{rtt: lan}, overQUIC, ReasonShort, false},
		{"long link", 20 << 10, 320, linkShows{rtt: shortLinkRTT + time.Millisecond}, overQUIC, ReasonShort, false},
		{"round trip unknown", 20 << 10, 320, linkShows{}, overQUIC, ReasonShort, false},
		{"QUIC loses packets", 20 << 10, 320, linkShows{rtt: lan, quicSent: 1000, quicLost: 3}, overQUIC, ReasonShort, false},
		{"open TLS flows retransmit", 8 << 20, 400, linkShows{rtt: lan, tlsSent: 10000, tlsLost: 20}, overQUIC, ReasonInteractive, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChooser()
			for range shortFlows {
				c.done("b", "t", overQUIC, tc.bytes, tc.turns, time.Minute, now)
			}
			got, reason, handshake := c.pick("b", "t", true, nil, tc.link, now)
			if got != tc.want || reason != tc.reason || handshake != tc.handsh {
				t.Fatalf("got %s (%s, worth a handshake %v), want %s (%s, %v)", got, reason, handshake, tc.want, tc.reason, tc.handsh)
			}
		})
	}
	// The finished TLS flows' retransmissions count too.
	c := newChooser()
	for range shortFlows {
		c.done("b", "t", overTLS, 20<<10, 320, time.Minute, now)
	}
	c.tcpLoss("b", 5000, 10)
	if got, reason, _ := c.pick("b", "t", true, nil, linkShows{rtt: lan}, now); got != overQUIC {
		t.Fatalf("on a link whose finished TLS flows retransmitted: got %s (%s), want QUIC", got, reason)
	}
}
