package quic

import "time"

// dgControl decides how a channel sends: at once, as the application sent
// (unpaced), or paced at a rate below what the link delivered; and whether
// datagrams go twice. It sees the receiver's feedback as samples and is
// driven by one goroutine at a time (the channel holds its lock).
//
// It reads two signals of congestion, as BBR and delay-based controllers
// do, and not random loss, which on a long lossy leg is no sign of a full
// queue: the round trip growing over its minimum (a queue builds at the
// bottleneck), and loss well above the link's usual (a shallow buffer
// overflowing). Random loss is what copies repair, when the link has room
// for them.
type dgControl struct {
	minRTT      time.Duration
	minRTTAt    time.Time
	srtt        time.Duration
	paced       bool
	rate        float64 // bytes a second, while paced
	lastCut     time.Time
	lastGrow    time.Time
	backlogAt   time.Time // the queue last held a datagram back
	pacedSince  time.Time
	capacity    float64 // bytes a second the link delivered when it last showed congestion; 0: unknown
	capacityAt  time.Time
	copies      bool
	copiesAfter time.Time // no copies before (after congestion)

	// The link's usual loss, judged over windows of lossWindow packets
	// sent without congestion.
	baseLoss   float64
	baseJudged bool
	winSent    float64
	winLost    float64
	winCongest bool
	sendRate   float64 // bytes a second offered, the last sample's

	// queuedRounds counts samples in a row whose round trip showed a
	// queue: one alone is a scheduling stall or jitter, not a queue.
	queuedRounds int
	// delivered holds recent delivery rates: on congestion the rate is
	// the most the link delivered lately, not the last interval's,
	// which a stall can make any figure.
	delivered [16]struct {
		at   time.Time
		rate float64
	}
	deliveredNext int
}

const (
	// minRTTWindow is how long a minimum round trip stands.
	minRTTWindow = 10 * time.Second
	// queueDelayMin is the least queueing delay read as congestion; a
	// quarter of the minimum round trip, if more. A busy host's relays
	// and scheduler add tens of milliseconds now and then: a queue must
	// last queuedRoundsMin intervals (150 ms) to count.
	queueDelayMin   = 20 * time.Millisecond
	queuedRoundsMin = 3
	// lossWindow is the packets a loss judgement takes.
	lossWindow = 1000
	// copyLoss is the usual loss from which datagrams go twice.
	copyLoss = 0.001
	// copyHeadroom: copies only while twice what is offered stays below
	// this share of the capacity last seen.
	copyHeadroom = 0.8
	// copyPause is how long copies stay off after they congested a link,
	// copyShed after a queue showed while they went; capacityHold how
	// long a capacity seen stands.
	copyPause    = 30 * time.Second
	copyShed     = 5 * time.Second
	capacityHold = time.Minute
	// unpaceAfter without a backlog, pacing ends: the sender's rate fits.
	unpaceAfter = 2 * time.Second
	// minPacedRate is the least rate pacing goes down to: 1 Mbit/s.
	minPacedRate = 125_000
)

// dgSample is what one interval of feedback says.
type dgSample struct {
	rtt       time.Duration // 0: none this interval
	delivered float64       // bytes a second the receiver got, copies included
	offered   float64       // bytes a second sent, copies included
	sent      float64       // packets sent (copies included) that the interval's feedback covers
	lost      float64       // of those, not received
}

// onSample takes a feedback interval.
func (c *dgControl) onSample(now time.Time, s dgSample) {
	c.sendRate = s.offered
	if s.rtt > 0 {
		if c.minRTT == 0 || s.rtt < c.minRTT || now.Sub(c.minRTTAt) > minRTTWindow {
			c.minRTT, c.minRTTAt = s.rtt, now
		}
		if c.srtt == 0 {
			c.srtt = s.rtt
		} else {
			c.srtt = (7*c.srtt + s.rtt) / 8
		}
	}
	c.delivered[c.deliveredNext%len(c.delivered)] = struct {
		at   time.Time
		rate float64
	}{now, s.delivered}
	c.deliveredNext++
	queued := s.rtt > 0 && s.rtt-c.minRTT > max(c.minRTT/4, queueDelayMin)
	if queued {
		c.queuedRounds++
	} else {
		c.queuedRounds = 0
	}
	// Loss is read against the link's usual once that is known: a link
	// that loses 3% at random is not congested for it.
	lossy := c.baseJudged && s.sent >= 100 && s.lost/s.sent > 3*c.baseLoss+0.02
	lately := c.deliveredLately(now)
	// A queue the channel's own datagrams did not make (the link lately
	// delivered what it is offered) is another sender's, or a stall of
	// the hosts: pacing below the offer would only drop its datagrams.
	overLink := s.offered > 1.1*lately
	if queued && c.copies {
		// Copies are the first load to shed, at the first sign of a
		// queue: they may be what fills it. Where the link did not
		// keep up, what it delivered is its capacity.
		c.copies = false
		c.copiesAfter = now.Add(copyShed)
		if overLink {
			c.capacity, c.capacityAt = lately, now
		}
	}
	if c.queuedRounds >= queuedRoundsMin && overLink || lossy {
		c.congested(now, lately)
	}
	// The usual loss is judged over windows without a queue: a loss
	// burst cannot keep it from being learnt.
	c.judgeLoss(s, queued)
	if c.capacity > 0 && now.Sub(c.capacityAt) > capacityHold {
		c.capacity = 0
	}
	// What the sender offers without its copies, twice, must fit.
	offer := c.sendRate
	if c.copies {
		offer /= 2
	}
	c.copies = c.baseJudged && c.baseLoss >= copyLoss && !now.Before(c.copiesAfter) &&
		(c.capacity == 0 || 2*offer < copyHeadroom*c.capacity) && !c.paced
	if !c.paced {
		return
	}
	if now.Sub(c.backlogAt) > unpaceAfter && now.Sub(c.pacedSince) > unpaceAfter {
		c.paced = false
		return
	}
	// Probe for more while the sender has more to send and the link
	// shows no queue: half more each round trip, so a rate cut by
	// mistake (the link had room) costs a few round trips at most.
	if !queued && !lossy && now.Sub(c.backlogAt) < c.roundTrip() && now.Sub(c.lastGrow) >= c.roundTrip() && now.Sub(c.lastCut) >= c.roundTrip() {
		c.rate *= 1.5
		c.lastGrow = now
	}
}

// deliveredLately is the most the link delivered over the last two round
// trips (200 ms at least).
func (c *dgControl) deliveredLately(now time.Time) float64 {
	window := max(2*c.roundTrip(), 200*time.Millisecond)
	most := 0.0
	for _, d := range c.delivered {
		if !d.at.IsZero() && now.Sub(d.at) <= window {
			most = max(most, d.rate)
		}
	}
	return most
}

// congested paces at what the link delivered lately, copies off; once a
// round trip, since what was sent before the cut still arrives as
// congested.
func (c *dgControl) congested(now time.Time, delivered float64) {
	if !c.lastCut.IsZero() && now.Sub(c.lastCut) < c.roundTrip() {
		return
	}
	c.lastCut = now
	c.capacity, c.capacityAt = delivered, now
	if c.copies {
		// Copies made the load: they stop first, and pacing at what
		// arrived (copies counted) leaves the datagrams themselves room.
		c.copies = false
		c.copiesAfter = now.Add(copyPause)
	}
	if !c.paced {
		c.pacedSince = now
	}
	c.paced = true
	c.rate = max(0.95*delivered, minPacedRate)
}

// judgeLoss adds the interval to the loss window; a window without
// congestion updates the link's usual loss.
func (c *dgControl) judgeLoss(s dgSample, congested bool) {
	c.winSent += s.sent
	c.winLost += s.lost
	c.winCongest = c.winCongest || congested
	if c.winSent < lossWindow {
		return
	}
	if !c.winCongest {
		loss := c.winLost / c.winSent
		if !c.baseJudged {
			c.baseLoss, c.baseJudged = loss, true
		} else {
			c.baseLoss = 0.7*c.baseLoss + 0.3*loss
		}
	}
	c.winSent, c.winLost, c.winCongest = 0, 0, false
}

func (c *dgControl) roundTrip() time.Duration {
	if c.srtt > 0 {
		return c.srtt
	}
	return 100 * time.Millisecond
}

// lagBound is how long a datagram may wait at this hop: the link's round
// trip, within [20 ms, 250 ms]; a datagram later than that is of little
// use to a real-time sender and only delays the ones behind it.
func (c *dgControl) lagBound() time.Duration {
	if c.minRTT == 0 {
		return 100 * time.Millisecond
	}
	return min(max(c.minRTT, 20*time.Millisecond), 250*time.Millisecond)
}
