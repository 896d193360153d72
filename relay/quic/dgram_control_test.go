package quic

import (
	"testing"
	"time"
)

// feed gives c samples every 50 ms for d, from start, as s says.
func feed(c *dgControl, start time.Time, d time.Duration, s func(time.Duration) dgSample) time.Time {
	now := start
	for t := 50 * time.Millisecond; t <= d; t += 50 * time.Millisecond {
		now = start.Add(t)
		c.onSample(now, s(t))
	}
	return now
}

const mbit = 125_000.0 // bytes a second

// A long leg that loses 1% at random, with room: the sender's rate goes
// on unpaced, and datagrams go twice once the loss is known.
func TestControlIgnoresRandomLoss(t *testing.T) {
	var c dgControl
	now := feed(&c, time.Unix(1000, 0), 3*time.Second, func(time.Duration) dgSample {
		// 40 Mbit/s of 1,200-byte datagrams: 208 in 50 ms, 2 lost.
		return dgSample{rtt: 152 * time.Millisecond, delivered: 39.6 * mbit, offered: 40 * mbit, sent: 208, lost: 2}
	})
	if c.paced {
		t.Fatalf("random loss paced the channel at %.1f Mbit/s", c.rate/mbit)
	}
	if !c.copies {
		t.Fatalf("a link losing %.2f%% with room sends no copies", 100*c.baseLoss)
	}
	if c.lagBound() != 152*time.Millisecond {
		t.Errorf("lag bound %v, want the round trip", c.lagBound())
	}
	// Twice 40 Mbit/s fits the link: the round trip stays, copies go on.
	feed(&c, now, time.Second, func(time.Duration) dgSample {
		return dgSample{rtt: 153 * time.Millisecond, delivered: 79.8 * mbit, offered: 80 * mbit, sent: 416, lost: 4}
	})
	if c.paced || !c.copies {
		t.Fatalf("copies with room: paced %v, copies %v", c.paced, c.copies)
	}
}

// A queue building at the bottleneck: paced at what arrived, copies off
// first; then, with more to send and no queue, a quarter more per round
// trip; without a backlog for a while, unpaced again.
func TestControlPacesOnQueueingDelay(t *testing.T) {
	var c dgControl
	start := time.Unix(1000, 0)
	now := feed(&c, start, 3*time.Second, func(time.Duration) dgSample {
		return dgSample{rtt: 100 * time.Millisecond, delivered: 60 * mbit, offered: 60 * mbit, sent: 300, lost: 3}
	})
	if !c.copies {
		t.Fatal("no copies on a lossy link with room")
	}
	// The copies fill the link: the round trip grows.
	now = feed(&c, now, 200*time.Millisecond, func(d time.Duration) dgSample {
		return dgSample{rtt: 100*time.Millisecond + 40*time.Millisecond + d/4, delivered: 100 * mbit, offered: 120 * mbit, sent: 600, lost: 6}
	})
	if !c.paced || c.copies {
		t.Fatalf("after the queue grew: paced %v, copies %v", c.paced, c.copies)
	}
	if c.rate < 90*mbit || c.rate > 100*mbit {
		t.Fatalf("paced at %.1f Mbit/s, want 95%% of the 100 delivered", c.rate/mbit)
	}
	// The sender offers more than the rate, and the link shows no queue.
	r0 := c.rate
	from := now
	now = feed(&c, now, time.Second, func(d time.Duration) dgSample {
		c.backlogAt = from.Add(d)
		return dgSample{rtt: 100 * time.Millisecond, delivered: 95 * mbit, offered: 95 * mbit, sent: 500, lost: 5}
	})
	if c.rate < 1.5*r0 {
		t.Fatalf("with a backlog and no queue the rate went from %.1f to %.1f Mbit/s in a second", r0/mbit, c.rate/mbit)
	}
	// Nothing held back for unpaceAfter: the sender's rate fits.
	c.backlogAt = now
	feed(&c, now, unpaceAfter+500*time.Millisecond, func(time.Duration) dgSample {
		return dgSample{rtt: 100 * time.Millisecond, delivered: 50 * mbit, offered: 50 * mbit, sent: 250, lost: 2}
	})
	if c.paced {
		t.Fatal("still paced with no backlog")
	}
	// Copies stay off while twice the offer would fill most of the link
	// last seen (100 Mbit/s).
	if c.copies {
		t.Fatal("copies went back on where they would fill the link")
	}
}

// Loss far above the link's usual (a shallow buffer overflowing) is
// congestion too.
func TestControlPacesOnLossBurst(t *testing.T) {
	var c dgControl
	now := feed(&c, time.Unix(1000, 0), 2*time.Second, func(time.Duration) dgSample {
		return dgSample{rtt: 30 * time.Millisecond, delivered: 20 * mbit, offered: 20 * mbit, sent: 100}
	})
	c.onSample(now.Add(50*time.Millisecond), dgSample{rtt: 30 * time.Millisecond, delivered: 50 * mbit, offered: 80 * mbit, sent: 400, lost: 150})
	if !c.paced || c.rate > 50*mbit {
		t.Fatalf("a 37%% loss burst: paced %v at %.1f Mbit/s", c.paced, c.rate/mbit)
	}
}

func TestLagBound(t *testing.T) {
	for _, tc := range []struct{ rtt, want time.Duration }{
		{0, 100 * time.Millisecond},
		{time.Millisecond, 20 * time.Millisecond},
		{69 * time.Millisecond, 69 * time.Millisecond},
		{time.Second, 250 * time.Millisecond},
	} {
		c := dgControl{minRTT: tc.rtt}
		if got := c.lagBound(); got != tc.want {
			t.Errorf("round trip %v: bound %v, want %v", tc.rtt, got, tc.want)
		}
	}
}

// A relay's stall (a busy core) shows as one interval with a long round
// trip and little delivered: no pacing, and when a queue does show, the
// rate is what the link delivered lately, not the stalled interval's.
func TestControlRidesOutAStall(t *testing.T) {
	var c dgControl
	steady := func(time.Duration) dgSample {
		return dgSample{rtt: 300 * time.Millisecond, delivered: 4 * mbit, offered: 4 * mbit, sent: 21}
	}
	now := feed(&c, time.Unix(1000, 0), 2*time.Second, steady)
	now = now.Add(50 * time.Millisecond)
	c.onSample(now, dgSample{rtt: 420 * time.Millisecond, delivered: 0.2 * mbit, offered: 4 * mbit, sent: 21})
	now = feed(&c, now, time.Second, steady)
	if c.paced {
		t.Fatalf("one stalled interval paced the channel at %.2f Mbit/s", c.rate/mbit)
	}
	// Stalled intervals in a row: still the hosts, since the link lately
	// delivered all the channel offers.
	for range queuedRoundsMin {
		now = now.Add(50 * time.Millisecond)
		c.onSample(now, dgSample{rtt: 430 * time.Millisecond, delivered: 0.3 * mbit, offered: 4 * mbit, sent: 21})
	}
	if c.paced {
		t.Fatalf("a queue the link delivered through paced the channel at %.2f Mbit/s", c.rate/mbit)
	}
	// The sender doubles its rate and a queue builds: paced at what the
	// link delivered lately, not the stalled interval's.
	now = feed(&c, now, 300*time.Millisecond, steady)
	for i := 1; i <= queuedRoundsMin; i++ {
		c.onSample(now.Add(time.Duration(i)*50*time.Millisecond), dgSample{rtt: 420 * time.Millisecond, delivered: 0.3 * mbit, offered: 8 * mbit, sent: 42})
	}
	if !c.paced || c.rate < 3.5*mbit || c.rate > 4*mbit {
		t.Fatalf("a queue after a steady 4 Mbit/s, 8 offered: paced %v at %.2f Mbit/s, want about 3.8", c.paced, c.rate/mbit)
	}
}

// A queue that shows while copies go stops the copies at once, before
// any pacing.
func TestControlShedsCopiesFirst(t *testing.T) {
	var c dgControl
	now := feed(&c, time.Unix(1000, 0), 3*time.Second, func(time.Duration) dgSample {
		return dgSample{rtt: 100 * time.Millisecond, delivered: 40 * mbit, offered: 40 * mbit, sent: 200, lost: 2}
	})
	if !c.copies {
		t.Fatal("no copies on a lossy link with room")
	}
	c.onSample(now.Add(50*time.Millisecond), dgSample{rtt: 140 * time.Millisecond, delivered: 79 * mbit, offered: 80 * mbit, sent: 400, lost: 4})
	if c.copies || c.paced {
		t.Fatalf("the first queued interval: copies %v, paced %v", c.copies, c.paced)
	}
}
