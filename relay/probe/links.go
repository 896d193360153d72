package probe

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoplink/hoplink/measure"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/metrics"
)

// Sender is a live connection to a peer that probes can be sent on.
type Sender interface {
	// SendProbe sends one probe datagram; the peer echoes its payload.
	SendProbe(payload []byte) error
	// SmoothedRTT is the connection's own RTT estimate.
	SmoothedRTT() time.Duration
}

// Peers is the link layer as a prober sees it.
type Peers interface {
	// Sender is the live connection to peer, or nil when it is down.
	Sender(peer string) Sender
	// Answered hears, after each round that sent probes, whether the peer
	// answered any: a live connection whose peer answers none of a
	// round's probes leads to a peer that died or is cut off.
	Answered(peer string, answered bool)
}

// Defaults of LinkOptions.
const (
	DefaultProbes = 5
	DefaultGap    = 5 * time.Millisecond
	DefaultWindow = 10
)

// LinkOptions configure a Links prober.
type LinkOptions struct {
	// Relay is the relay that probes: the from label of its metrics.
	Relay string
	// Peers is the link layer the probes go through.
	Peers   Peers
	Metrics *metrics.Metrics
	// Probes sent per round, Gap apart so that each rides its own packet.
	Probes int
	Gap    time.Duration
	// Window is how many rounds Loss and Min cover.
	Window int
}

// Links measures a relay's links to its peers. Rounds are coalesced (a link
// measured less than `fresh` ago is not probed again, and callers that ask
// while a round runs share it), so the cost per peer stays bounded however
// many chains and controllers ask.
type Links struct {
	o    LinkOptions
	seq  atomic.Uint64
	last coalescer[string, measure.Link]

	mu      sync.Mutex
	stats   map[string]*linkStats
	waiting map[uint64]pendingProbe
}

type pendingProbe struct {
	peer string
	sent time.Time
	got  chan<- time.Duration
	// late marks a probe its round stopped waiting for. Its answer, until
	// the peer's next round, still says the peer answers (see lateEcho).
	late bool
}

// linkStats is what a link's figures are computed from across rounds.
type linkStats struct {
	rounds []roundStats // the recent rounds, oldest first
	jitter time.Duration
	prev   time.Duration // the previous sample, for jitter
}

type roundStats struct {
	sent, answered int
	min            time.Duration
}

// NewLinks makes a prober. Feed it the echoes of its probes with Echo.
func NewLinks(o LinkOptions) *Links {
	if o.Probes <= 0 {
		o.Probes = DefaultProbes
	}
	if o.Gap <= 0 {
		o.Gap = DefaultGap
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	return &Links{o: o, stats: map[string]*linkStats{}, waiting: map[uint64]pendingProbe{}}
}

// Echo takes the answer to a probe. Answers that match no probe in
// flight (late, duplicated, forged) are ignored.
func (l *Links) Echo(peer string, payload []byte) {
	now := time.Now()
	if len(payload) != 8 {
		return
	}
	seq := binary.BigEndian.Uint64(payload)
	l.mu.Lock()
	p, ok := l.waiting[seq]
	ok = ok && p.peer == peer
	if ok {
		delete(l.waiting, seq)
	}
	l.mu.Unlock()
	switch {
	case ok && p.late:
		l.lateEcho(peer, now.Sub(p.sent))
	case ok:
		p.got <- now.Sub(p.sent) // buffered for every probe of the round
	}
}

// lateEcho takes the answer to a probe that came after its round stopped
// waiting: on a busy host a peer can answer every round a little too late,
// and counting none of it would keep the link down and the peer silent
// (down for new flows) for as long as the host stays busy. The answer
// counts in the round's loss and minimum; a round that found the link
// down now finds it up, at this round trip, and the peer answering.
func (l *Links) lateEcho(peer string, rtt time.Duration) {
	l.mu.Lock()
	st := l.stats[peer]
	if st == nil || len(st.rounds) == 0 {
		l.mu.Unlock()
		return
	}
	rs := &st.rounds[len(st.rounds)-1]
	rs.answered++
	if rs.min == 0 || rtt < rs.min {
		rs.min = rtt
	}
	link := l.figures(st, measure.Link{To: peer, Up: true, RTT: measure.Duration(rtt)})
	l.mu.Unlock()
	if !l.last.setIf(peer, link, func(was measure.Link) bool { return !was.Up }) {
		return // it was up: a straggler only
	}
	l.o.Peers.Answered(peer, true)
	l.export(link, 0, 0) // the counters keep it lost: it was, by its round's end
}

// Measure returns the links to peers, probing those not measured within
// fresh. A round waits for answers until ctx ends or every probe is
// answered; probes unanswered by then count as lost.
func (l *Links) Measure(ctx context.Context, peers []string, fresh time.Duration) []measure.Link {
	return l.last.all(ctx, peers, fresh, func(l measure.Link) bool { return l.Up },
		func(peer string) measure.Link { return l.round(ctx, peer) },
		func(link *measure.Link, peer string, age time.Duration) {
			link.To, link.Age = peer, measure.Duration(age)
		})
}

// round probes one peer and folds the result into its state.
func (l *Links) round(ctx context.Context, peer string) measure.Link {
	var samples []time.Duration
	sent := 0
	var smoothed time.Duration
	var probed Sender
	l.mu.Lock()
	for seq, p := range l.waiting {
		if p.peer == peer && p.late { // superseded by this round
			delete(l.waiting, seq)
		}
	}
	l.mu.Unlock()
	if c := l.o.Peers.Sender(peer); c != nil {
		probed = c
		got := make(chan time.Duration, l.o.Probes)
		var seqs []uint64
		for i := range l.o.Probes {
			if i > 0 {
				select {
				case <-time.After(l.o.Gap):
				case <-ctx.Done():
				}
			}
			if ctx.Err() != nil {
				break
			}
			seq := l.seq.Add(1)
			var payload [8]byte
			binary.BigEndian.PutUint64(payload[:], seq)
			l.mu.Lock()
			l.waiting[seq] = pendingProbe{peer: peer, sent: time.Now(), got: got}
			l.mu.Unlock()
			seqs = append(seqs, seq)
			sent++
			if c.SendProbe(payload[:]) != nil {
				break // the connection went down: the rest would fail too
			}
		}
	wait:
		for len(samples) < sent {
			select {
			case d := <-got:
				samples = append(samples, d)
			case <-ctx.Done():
				break wait
			}
		}
		l.mu.Lock()
		for _, s := range seqs {
			if p, ok := l.waiting[s]; ok {
				p.late = true
				l.waiting[s] = p
			}
		}
		l.mu.Unlock()
		smoothed = c.SmoothedRTT()
	}

	// A round over a connection that was replaced meanwhile (the peer came
	// back) says nothing of the new one.
	if sent > 0 && (len(samples) > 0 || l.o.Peers.Sender(peer) == probed) {
		l.o.Peers.Answered(peer, len(samples) > 0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats[peer]
	if st == nil {
		st = &linkStats{}
		l.stats[peer] = st
	}
	rs := roundStats{sent: sent, answered: len(samples)}
	for _, s := range samples {
		if st.prev > 0 {
			st.jitter += (absDur(s-st.prev) - st.jitter) / 16
		}
		st.prev = s
	}
	link := measure.Link{To: peer, Up: len(samples) > 0, Smoothed: measure.Duration(smoothed)}
	if link.Up {
		sorted := slices.Clone(samples)
		slices.Sort(sorted)
		link.RTT = measure.Duration(sorted[len(sorted)/2])
		rs.min = sorted[0]
	}
	st.rounds = append(st.rounds, rs)
	if len(st.rounds) > l.o.Window {
		st.rounds = st.rounds[1:]
	}
	link = l.figures(st, link)
	l.export(link, sent, len(samples))
	return link
}

// figures fills in a link's loss, minimum and jitter from its recent
// rounds. l.mu is held.
func (l *Links) figures(st *linkStats, link measure.Link) measure.Link {
	var allSent, allAnswered int
	var minRTT time.Duration
	for _, r := range st.rounds {
		allSent += r.sent
		allAnswered += r.answered
		if r.min > 0 && (minRTT == 0 || r.min < minRTT) {
			minRTT = r.min
		}
	}
	if allSent > 0 {
		link.Loss = float64(allSent-allAnswered) / float64(allSent)
	}
	link.Min, link.Jitter = measure.Duration(minRTT), measure.Duration(st.jitter)
	return link
}

func (l *Links) export(link measure.Link, sent, answered int) {
	m := l.o.Metrics
	if m == nil {
		return
	}
	from, to := l.o.Relay, link.To
	m.LinkUp.WithLabelValues(from, to).Set(boolFloat(link.Up))
	m.LinkLoss.WithLabelValues(from, to).Set(link.Loss)
	m.LinkProbes.WithLabelValues(from, to, "answered").Add(float64(answered))
	m.LinkProbes.WithLabelValues(from, to, "lost").Add(float64(sent - answered))
	if link.Smoothed > 0 {
		m.LinkSmoothed.WithLabelValues(from, to).Set(link.Smoothed.D().Seconds())
	}
	if link.Up {
		m.LinkRTT.WithLabelValues(from, to).Set(link.RTT.D().Seconds())
		m.LinkRTTMin.WithLabelValues(from, to).Set(link.Min.D().Seconds())
		m.LinkJitter.WithLabelValues(from, to).Set(link.Jitter.D().Seconds())
	}
}

// Stale drops peer's last round from reuse: something changed (the peer
// drains) that the next round must see.
func (l *Links) Stale(peer string) { l.last.stale(peer) }

// Retain forgets every peer not in keep (peers the relay no longer uses),
// and their metrics.
func (l *Links) Retain(keep []string) {
	gone := l.last.retain(func(p string) bool { return slices.Contains(keep, p) })
	l.mu.Lock()
	for _, p := range gone {
		delete(l.stats, p)
	}
	for seq, p := range l.waiting {
		if p.late && !slices.Contains(keep, p.peer) {
			delete(l.waiting, seq)
		}
	}
	l.mu.Unlock()
	m := l.o.Metrics
	if m == nil {
		return
	}
	for _, peer := range gone {
		for _, g := range []*prometheus.GaugeVec{m.LinkUp, m.LinkRTT, m.LinkRTTMin, m.LinkSmoothed, m.LinkJitter, m.LinkLoss} {
			g.DeleteLabelValues(l.o.Relay, peer)
		}
		m.LinkProbes.DeleteLabelValues(l.o.Relay, peer, "answered")
		m.LinkProbes.DeleteLabelValues(l.o.Relay, peer, "lost")
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
