package relay

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/relay/flow"
)

// fairShare shares each link this relay sends into (to one peer) by
// Tunnel, not by connection. Over TLS every flow is a TCP connection of
// its own, and the kernel shares a link per connection: a Tunnel of 8
// flows took 89% beside a Tunnel of 1 (hack/bench/share). Each window the
// relay looks at what each Tunnel wrote to the peer and whether its flows
// were backlogged (their writes blocked, or they waited for their cap).
// When a backlogged Tunnel gets less than its weighted max-min fair share
// of the link (spec.limits.weight), the Tunnels over theirs are capped at theirs, with token buckets
// their flows wait on before each write (flow.Pacer, like
// spec.limits.rateMbps); what they give up the other Tunnel takes through
// its own congestion control. The caps hold while a Tunnel below them
// still wants more, and lift by a tenth a window once none does, so a
// Tunnel alone gets the whole link.
type fairShare struct {
	mu    sync.Mutex
	links map[string]*fairLink // by peer
	last  time.Time            // the last window's end
}

// fairWindow is how often the shares are looked at: long enough to hold
// several writes of a busy flow, short against a flow's life.
const fairWindow = 250 * time.Millisecond

const (
	// backlogged: its flows spent half the window or more (summed) in
	// writes to the link or waiting for their cap. An application-limited
	// flow's writes find room in the socket and return at once.
	backloggedBusy = 0.5
	// underShare: a backlogged Tunnel under this part of its share is
	// short of it. Close to 1: a Tunnel held to 20 Mbit/s by its limit
	// stayed at 18.7 beside a greedy one under auto with 0.9
	// (hack/bench/share), and being short only caps the Tunnels over
	// their shares at them.
	underShare = 0.95
	// capLift is how much caps rise a window once no uncapped Tunnel wants
	// more: a tenth, so a Tunnel that comes back finds the link not yet
	// taken by the others' congestion windows.
	capLift = 1.1
	// capacityDecay is how fast the estimate of the link's capacity
	// follows a link that carries less (per window, about 8% a second):
	// slow, so that caps do not shrink with the link's total while the
	// Tunnel they make room for is still growing into it.
	capacityDecay = 0.98
	// peakDecay: how fast the link's peak is forgotten (per window,
	// about 2% a second, half in 35 s).
	peakDecay = 0.995
	// spareCheck: while caps leave the link a quarter of its peak
	// spare, each short Tunnel must grow by a tenth every spareCheck
	// windows (2 s), or it is deaf for deafFor: whatever binds it (a slow
	// target, the other end's window) is not this link, and capping
	// the others for it would only waste the link.
	spareCheck = 8
	deafFor    = 30 * time.Second
	// forgetAfter: a Tunnel without flows on a link for this many windows
	// is forgotten.
	forgetAfter = 40
	// congestedLoss: a UDP Tunnel whose datagrams the link lost past the
	// relay at more than this part of what it sent wants more than the
	// link carries for it: a queue overflows (random loss on a path is
	// far less; the datagram channel's copies repair it).
	congestedLoss = 0.05
	// warmup: a link's first windows of traffic (after a quiet one) set
	// no caps and teach nothing of its capacity.
	warmup = 4
)

// fairLink is what the relay sends to one peer.
type fairLink struct {
	tunnels  map[string]*fairTunnel
	capacity float64 // bytes a second: the most the link carried lately
	// peak is the most it carried, forgotten far slower than capacity:
	// the spare check's measure. Caps that a short Tunnel does not take
	// up lower what the link carries, and capacity follows; judged by
	// capacity, a slow Tunnel that claims to want more (its target reads
	// slowly) would hold the others near its own rate for good.
	peak  float64
	avg   float64 // the link's total, smoothed over about a second
	spare int     // windows caps have held with the link under 0.75 capacity
	busy  int     // windows in a row it carried bytes
}

// fairTunnel is one Tunnel's flows on a link. The counters are what its
// flows write each window; the rest is the allocator's, under fairShare.mu.
type fairTunnel struct {
	bytes atomic.Int64
	// busy and writing give the time its flows spent in writes (and
	// waits for the cap) as they go, not when a write ends: a TCP
	// socket wakes a blocked writer only once half its buffer drained,
	// so a flow's write on a busy link can block for longer than a
	// window. Each write adds minus its start (fairClock) to busy and 1
	// to writing, and its end and -1: busy + writing*now is the sum
	// of the time spent, which wraps in int64 and differs correctly.
	busy    atomic.Int64
	writing atomic.Int64
	flows   atomic.Int32
	// pushed: datagrams of its UDP sessions were dropped this window for
	// want of room (fairDatagrams.lost, or its cap): it wants more of the
	// link than it gets, as a TCP flow whose writes block does.
	pushed atomic.Bool
	// datagrams: it is a UDP Tunnel (fairDatagrams joined it).
	datagrams atomic.Bool
	// linkLost is its datagrams' bytes the link lost past the relay this
	// window (fairDatagrams.lostOnLink).
	linkLost atomic.Int64
	on       atomic.Bool // capped: its flows take from limit before each write
	limit    *rate.Limiter
	// ceiling is its spec.limits rate in bytes a second (0: none): it
	// wants no more than that, whatever its flows' backlog says.
	ceiling float64
	// weight is its spec.limits.weight (at least 1): its share of the
	// link against the others' is in proportion to it.
	weight float64
	waited flow.Counter // may be nil

	rate, avg float64 // bytes a second: this window's, smoothed
	backlog   bool
	busyMark  int64   // busy + writing*now at the last window's end
	capRate   float64 // its cap, when on
	idle      int
	deafUntil time.Time
	grewFrom  float64 // avg at the last spare check
}

// join registers a flow of tunnel that sends to peer; release when it
// ends, after its copy did. ceilingBps is the Tunnel's rate limit in
// bytes a second, 0 for none; waited counts the time its flows wait for
// their cap.
func (fs *fairShare) join(peer, tunnel string, ceilingBps float64, waited flow.Counter) (*fairTunnel, func()) {
	return fs.joinWeighted(peer, tunnel, 1, ceilingBps, waited)
}

// joinWeighted is join for a Tunnel of weight (below 1 taken for 1).
func (fs *fairShare) joinWeighted(peer, tunnel string, weight int, ceilingBps float64, waited flow.Counter) (*fairTunnel, func()) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.links == nil {
		fs.links = map[string]*fairLink{}
	}
	l := fs.links[peer]
	if l == nil {
		l = &fairLink{tunnels: map[string]*fairTunnel{}}
		fs.links[peer] = l
	}
	t := l.tunnels[tunnel]
	if t == nil {
		// waited is set once: flows read it as they wait, unlocked.
		t = &fairTunnel{limit: rate.NewLimiter(rate.Inf, minBurst), waited: waited}
		l.tunnels[tunnel] = t
	}
	t.ceiling = ceilingBps
	t.weight = float64(max(weight, 1))
	t.flows.Add(1)
	t.idle = 0
	return t, func() { t.flows.Add(-1) }
}

// run looks at the shares every fairWindow until ctx ends.
func (fs *fairShare) run(ctx context.Context) {
	tk := time.NewTicker(fairWindow)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			fs.tick(now)
		}
	}
}

// tick closes a window at now.
func (fs *fairShare) tick(now time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dt := now.Sub(fs.last)
	fs.last = now
	if dt <= 0 || dt > 4*fairWindow {
		// The first window, or the relay stood still: no rate to take
		// from it. Drain the counters.
		dt = 0
	}
	for peer, l := range fs.links {
		if l.tick(now, dt) {
			delete(fs.links, peer)
		}
	}
}

// tick closes a window of dt (0: drain only) on the link; true when the
// link has no Tunnel left.
func (l *fairLink) tick(now time.Time, dt time.Duration) (empty bool) {
	total, backlog := 0.0, false
	for name, t := range l.tunnels {
		b := t.bytes.Swap(0)
		lost := t.linkLost.Swap(0)
		mark := t.busy.Load() + t.writing.Load()*fairClock()
		busy := mark - t.busyMark
		t.busyMark = mark
		if t.flows.Load() == 0 && b == 0 {
			if t.idle++; t.idle > forgetAfter {
				t.uncap()
				delete(l.tunnels, name)
				continue
			}
		} else {
			t.idle = 0
		}
		if dt == 0 {
			continue
		}
		// Below 0 when a datagram channel dropped more of its datagrams
		// than it handed over this window (fairDatagrams.lost).
		t.rate = max(float64(b), 0) / dt.Seconds()
		t.avg = smooth(t.avg, t.rate)
		pushed := t.pushed.Swap(false) // this window's, whatever else says backlogged
		t.backlog = float64(busy) >= backloggedBusy*float64(dt) || pushed ||
			lost > 0 && float64(lost) > congestedLoss*float64(max(b, 0)+lost)
		backlog = backlog || t.backlog
		total += t.rate
	}
	if len(l.tunnels) == 0 {
		return true
	}
	if dt == 0 {
		return false
	}
	if total == 0 && !backlog {
		// Quiet: its next traffic fills buffers anew, and its capacity
		// is learnt anew, not reckoned from Tunnels that went.
		l.busy, l.capacity, l.peak = 0, 0, 0
		return false
	}
	if l.busy++; l.busy <= warmup {
		// Writes fill the sockets' buffers first: more than the link
		// carries, which would set the caps too high for seconds.
		l.avg = 0
		return false
	}
	l.avg = smooth(l.avg, total)
	l.capacity = max(l.avg, l.capacity*capacityDecay)
	l.peak = max(l.avg, l.peak*peakDecay)
	l.allocate(now)
	return false
}

// smooth averages rates over about a second (four windows), from the
// first window's: starting at 0 would take the link for a slower one
// than it is, and cap the Tunnels to that.
func smooth(avg, x float64) float64 {
	if avg == 0 {
		return x
	}
	return 0.75*avg + 0.25*x
}

// allocate sets the caps from the window just closed.
func (l *fairLink) allocate(now time.Time) {
	ts := make([]*fairTunnel, 0, len(l.tunnels))
	for _, t := range l.tunnels {
		ts = append(ts, t)
	}
	share := waterfill(ts, l.capacity)
	// wanting: an uncapped Tunnel that wants more of the link than it
	// gets; short: one of them under its share.
	short, wanting, capped := false, false, false
	for i, t := range ts {
		if t.on.Load() {
			capped = true
			// A capped UDP Tunnel may carry well under its cap: the
			// link loses its datagrams past the relay, which no
			// congestion control resends. Backlogged and under its
			// share, it is short as an uncapped one is (a TCP flow
			// fills its cap).
			if t.datagrams.Load() && t.backlog && t.avg < underShare*min(t.capRate, share[i]) {
				short = true
			}
			continue
		}
		if !t.backlog || now.Before(t.deafUntil) {
			continue
		}
		wanting = true
		short = short || t.avg < underShare*share[i]
	}
	// Caps that leave the link spare for a Tunnel that does not take
	// what they free: it is bound elsewhere.
	if capped && wanting && l.avg < 0.75*l.peak {
		if l.spare++; l.spare >= spareCheck {
			l.spare = 0
			for i, t := range ts {
				if !t.on.Load() && t.backlog && t.avg < underShare*share[i] && t.avg < 1.1*t.grewFrom {
					t.deafUntil = now.Add(deafFor)
				}
				t.grewFrom = t.avg
			}
		}
	} else {
		l.spare = 0
		for _, t := range ts {
			t.grewFrom = t.avg
		}
	}
	switch {
	case short:
		for i, t := range ts {
			switch {
			case t.ceiling > 0 && share[i] >= t.ceiling:
				// Its own limit holds it to its share: a second
				// bucket at the same rate would only lose it the
				// tokens one of them wastes.
				t.uncap()
			case t.on.Load() || t.avg > share[i]:
				t.capAt(share[i])
			}
		}
	case wanting:
		// Shares about even, and a Tunnel still wants more: hold, but
		// no cap under its share (the link's capacity, or the Tunnels
		// on it, changed).
		for i, t := range ts {
			if t.on.Load() && t.capRate < share[i] {
				t.capAt(share[i])
			}
		}
	default:
		for _, t := range ts {
			if !t.on.Load() {
				continue
			}
			if c := t.capRate * capLift; c < l.capacity {
				t.capAt(c)
			} else {
				t.uncap()
			}
		}
	}
}

// waterfill is each Tunnel's weighted max-min fair share of capacity: a
// Tunnel that is not backlogged wants what it sends, one with a rate
// limit no more than that, the others all they can get; what is left is
// split in proportion to the weights of those that want more. Tunnels
// are filled in order of want per weight, so that one whose want is under
// its weighted part leaves the rest to the others.
func waterfill(ts []*fairTunnel, capacity float64) []float64 {
	want := make([]float64, len(ts))
	weight := make([]float64, len(ts))
	order := make([]int, len(ts))
	weights := 0.0
	for i, t := range ts {
		weight[i] = max(t.weight, 1) // a Tunnel made without join weighs 1
		weights += weight[i]
		want[i] = math.Inf(1)
		if !t.backlog {
			want[i] = t.avg
		}
		if t.ceiling > 0 {
			want[i] = min(want[i], t.ceiling)
		}
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		return want[order[a]]/weight[order[a]] < want[order[b]]/weight[order[b]]
	})
	share := make([]float64, len(ts))
	left := capacity
	for _, i := range order {
		part := left * weight[i] / weights
		share[i] = min(want[i], part)
		left -= share[i]
		weights -= weight[i]
	}
	return share
}

// capAt caps the Tunnel's flows on the link together at bps (bytes a
// second), with the burst of a rate limit's bucket.
func (t *fairTunnel) capAt(bps float64) {
	bps = max(bps, minBurst) // at least a copy buffer a second
	t.limit.SetLimit(rate.Limit(bps))
	t.limit.SetBurst(max(minBurst, int(bps*burstTime.Seconds())))
	t.capRate = bps
	t.on.Store(true)
}

func (t *fairTunnel) uncap() {
	t.on.Store(false)
	t.limit.SetLimit(rate.Inf)
	t.capRate = 0
}

// fairEpoch is what fairClock counts from.
var fairEpoch = time.Now()

// fairClock is monotonic nanoseconds.
func fairClock() int64 { return int64(time.Since(fairEpoch)) }

// fairPacer is one direction of a flow that sends into a link: it counts
// the flow's bytes and busy time into its Tunnel's, and holds the flow to
// the Tunnel's cap while there is one. It wraps the flow's counter (a
// pacedCounter under a rate limit, whose wait is not counted as busy:
// that Tunnel wants no more than its limit).
type fairPacer struct {
	flow.Counter
	t       *fairTunnel
	inWrite bool // between Pace and Add: counted in t.writing
}

func (p *fairPacer) Pace(n int, gone func() bool) {
	if inner, ok := p.Counter.(flow.Pacer); ok {
		inner.Pace(n, gone)
	}
	p.t.busy.Add(-fairClock())
	p.t.writing.Add(1)
	p.inWrite = true
	if p.t.on.Load() {
		wait(p.t.limit, n, gone, p.t.waited)
	}
}

// TryPace is Pace for an event loop, which cannot wait: false when the
// write must wait, for the Tunnel's cap or its rate limit (the loop then
// calls Pace on a goroutine).
func (p *fairPacer) TryPace(n int) bool {
	if _, ok := p.Counter.(flow.Pacer); ok || p.t.on.Load() {
		return false
	}
	p.t.busy.Add(-fairClock())
	p.t.writing.Add(1)
	p.inWrite = true
	return true
}

func (p *fairPacer) Add(n float64) {
	p.Counter.Add(n)
	p.t.bytes.Add(int64(n))
	p.done()
}

// done ends the write under way, if any: at its Add, or when the flow
// ends (a write that failed has no Add).
func (p *fairPacer) done() {
	if p.inWrite {
		p.inWrite = false
		p.t.busy.Add(fairClock())
		p.t.writing.Add(-1)
	}
}

// fairDatagrams is one direction of a UDP session that sends to a peer:
// it counts the session's datagrams into its Tunnel's share of that link,
// as fairPacer does a TCP flow's bytes, and drops those over the Tunnel's
// cap while it has one (a datagram cannot wait for tokens: the session's
// read loop serves every session of the Tunnel).
//
// A UDP Tunnel is backlogged (it wants more than it gets) when its
// sessions' sends spent half the window blocked (a full QUIC datagram
// queue, frames on a full stream or TLS connection), or when any of its
// datagrams were dropped for want of room: by a datagram channel that
// paces to a congested link (its queue full, or held past the lag bound:
// lost), by its cap, or by the link past the relay at more than
// congestedLoss of what it sent (the channel's feedback). A sender that a UDP Tunnel offers more than the
// link takes shows no blocked writes on the channel, which never blocks;
// the drops are what say so. What the channel dropped, and its share of
// what the link lost past the relay (the channel's feedback), is taken
// back out of the bytes counted, so that the link's capacity and the
// Tunnel's rate are what the link carried, not what was offered: else a
// Tunnel offering twice the link taught a capacity of twice the link, and
// its cap at half of that held nothing back.
type fairDatagrams struct {
	t    *fairTunnel
	over prometheus.Counter // dropped over the cap: reason fair_share
}

// admit says whether a datagram of n bytes may go now; one over the
// Tunnel's cap is dropped and counted.
func (d *fairDatagrams) admit(n int) bool {
	if !d.t.on.Load() || d.t.limit.AllowN(time.Now(), n) {
		return true
	}
	d.t.pushed.Store(true)
	d.over.Inc()
	return false
}

// start and end bracket a send (or a flush of frames) of the session;
// end counts the bytes it handed over.
func (d *fairDatagrams) start() {
	d.t.busy.Add(-fairClock())
	d.t.writing.Add(1)
}

func (d *fairDatagrams) end(sent int) {
	d.t.busy.Add(fairClock())
	d.t.writing.Add(-1)
	d.t.bytes.Add(int64(sent))
}

// lost is told of n bytes of a datagram the transport took and then
// dropped for want of room (rquic.Share.Dropped).
func (d *fairDatagrams) lost(n int) {
	d.t.bytes.Add(-int64(n))
	d.t.pushed.Store(true)
}

// lostOnLink is told of n bytes of its datagrams the link lost past this
// relay (rquic.Share.Lost): not carried, so not counted. Random loss is
// counted too, so only loss past congestedLoss says the Tunnel wants more.
func (d *fairDatagrams) lostOnLink(n int) {
	d.t.bytes.Add(-int64(n))
	d.t.linkLost.Add(int64(n))
}
