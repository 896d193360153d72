package flow

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	quicgo "github.com/quic-go/quic-go"
)

// The streams of a QUIC connection share its flow-control window: what a
// stream sent that its receiver has not read yet counts against it. A flow
// whose reader stalls (a client that stops reading a download, a target
// that stops reading an upload) keeps its stream's unread bytes there, and
// once enough such flows fill the window, no new flow on the connection
// (its Tunnel's) gets a byte through. Only the sender can tell: a new
// stream has its whole stream window free, larger than any first write,
// so a first write that finds no credit finds none in the connection's.
// Such a write waits newFlowWait; then the flows whose writes to the
// connection have waited longest (stalledFor at least) are reset, which
// makes the receiver drop their unread bytes and give the credit back.
const (
	// firstBytes: a stream's writes up to this offset are its first.
	firstBytes = copyBufSize
	// newFlowWait is how long a new stream's write may wait for credit
	// before a stalled flow of the connection is reset for it.
	newFlowWait = 250 * time.Millisecond
	// stalledFor is the least a flow's write must have waited for it to
	// be reset for a new one: the stall watch's first look.
	stalledFor = stallCheck
	// recheck, plus two round trips (the credit's way back), is the time
	// between two looks that reset. The receiver gives credit back in
	// batches, once a quarter of its connection window was read or
	// dropped since the last (quic-go), 16 MiB of 64: that can take
	// twenty resets of flows that hold a few hundred KiB each, while one
	// of a flow that grew its window on a long path is enough. So the
	// first look resets one flow, and each look that finds the new flow
	// still waiting one more than the last, up to maxResets: twenty
	// resets take six looks, and at most the last look's less one are
	// more than the batch needed, flows that stalled longest, which the
	// next new flows would have needed anyway. The batch then lets the
	// next new flows through without a reset.
	recheck   = 10 * time.Millisecond
	maxResets = 16
)

// ErrStalled is a flow that was reset while stuck in a write toward a
// QUIC stream for stalledFor or more, to free its connection's window for
// a new flow that waited.
var ErrStalled = errors.New("flow stalled: reset to let a new flow of its connection through")

// Window is what the flows writing to one QUIC connection's streams share.
// It knows two kinds of writers: halves that once waited in one write for
// stalledFor (their stall watch adds them when it first looks, and removes
// them when their flow ends, so flows that keep moving never touch the
// Window), and, while they wait, new streams' writes that found no credit.
type Window struct {
	rtt func() time.Duration

	mu      sync.Mutex
	stuck   map[*stallWatch]struct{}
	waiting map[*waiter]struct{}
	t       *time.Timer
	armed   bool
	closed  bool
	streak  int // looks in a row that found a write waiting newFlowWait
}

// waiter is a new stream's write waiting for credit.
type waiter struct{ since time.Duration }

// windows holds the Window of each QUIC connection with TCP flows.
var windows sync.Map // *quicgo.Conn -> *Window

// WindowOf returns connection c's Window, made on first use and dropped
// when c closes.
func WindowOf(c *quicgo.Conn) *Window {
	if v, ok := windows.Load(c); ok {
		return v.(*Window)
	}
	// The least round trip: a busy relay's own delays inflate the
	// smoothed one, and credit needs no more than the path's to return.
	w := newWindow(func() time.Duration { return c.ConnectionStats().MinRTT })
	if v, loaded := windows.LoadOrStore(c, w); loaded {
		return v.(*Window)
	}
	context.AfterFunc(c.Context(), func() {
		windows.Delete(c)
		w.close()
	})
	return w
}

func newWindow(rtt func() time.Duration) *Window {
	return &Window{rtt: rtt, stuck: map[*stallWatch]struct{}{}, waiting: map[*waiter]struct{}{}}
}

// epoch starts the monotonic clock of writes (now).
var epoch = time.Now()

// now is never 0, which a stall watch keeps for "not writing".
func now() time.Duration { return time.Since(epoch) + 1 }

// unlimited is a write limiter that limits nothing. quic-go returns from a
// Write while up to a packet's worth of it is still unsent (held for the
// next write or the FIN); with a limiter it returns only once every byte
// left in a frame, a small write too, so the wait ends when the flow has
// its credit.
func unlimited(n int) int { return n }

// write writes b, among the first bytes of stream s: at once when the
// window has credit for all of it, else as one of the waiters (check).
func (w *Window) write(s *quicgo.Stream, b []byte) (int, error) {
	err := s.TryWriteAll(b)
	if !errors.Is(err, quicgo.ErrWouldBlock) {
		if err != nil {
			return 0, err
		}
		return len(b), nil
	}
	wt := &waiter{since: now()}
	w.wait(wt)
	defer w.done(wt)
	return s.WriteWithLimit(b, unlimited)
}

func (w *Window) wait(wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting[wt] = struct{}{}
	w.arm(newFlowWait)
}

func (w *Window) done(wt *waiter) {
	w.mu.Lock()
	delete(w.waiting, wt)
	w.mu.Unlock()
}

// arm has check run after d, unless it is due already; w.mu held.
func (w *Window) arm(d time.Duration) {
	if w.closed || w.armed {
		return
	}
	w.armed = true
	if w.t == nil {
		w.t = time.AfterFunc(d, w.check)
		return
	}
	w.t.Reset(d)
}

// add counts h among the halves stuck writing to the connection.
func (w *Window) add(h *stallWatch) {
	w.mu.Lock()
	w.stuck[h] = struct{}{}
	w.mu.Unlock()
}

func (w *Window) remove(h *stallWatch) {
	w.mu.Lock()
	delete(w.stuck, h)
	w.mu.Unlock()
}

// check runs while writes wait: once one has waited newFlowWait, it resets
// the flows stalled longest (victims), then looks again after recheck and
// two round trips, until no write has waited that long.
func (w *Window) check() {
	w.mu.Lock()
	w.armed = false
	t := now()
	if len(w.waiting) == 0 {
		w.streak = 0
		w.mu.Unlock()
		return
	}
	oldest := t
	for wt := range w.waiting {
		oldest = min(oldest, wt.since)
	}
	if waited := t - oldest; waited < newFlowWait {
		w.streak = 0
		w.arm(newFlowWait - waited)
		w.mu.Unlock()
		return
	}
	w.streak = min(w.streak+1, maxResets)
	vs := w.victims(t, w.streak)
	if len(vs) == 0 {
		// Credit held by flows that wait elsewhere, or stalled too
		// recently: a victim can only come with time.
		w.arm(newFlowWait)
		w.mu.Unlock()
		return
	}
	for _, v := range vs {
		delete(w.stuck, v)
		// Counted here even when its previous hop reset it already (for
		// its own connection's window): this relay's reset is what gives
		// this connection its credit back, now rather than at the stall
		// watch's next look, and it shows where a window filled.
		v.evicted.Store(true)
	}
	w.arm(recheck + 2*w.rtt())
	w.mu.Unlock()
	for _, v := range vs {
		v.abort()
	}
}

// victims are the n halves to reset for the waiting writes, or fewer: of
// those stuck in a write now, past their first bytes, the ones that have
// waited longest, for stalledFor at least. A flow that stalled first is
// reset first; one that moves again leaves the running.
func (w *Window) victims(t time.Duration, n int) []*stallWatch {
	type candidate struct {
		h     *stallWatch
		since time.Duration
	}
	var cs []candidate
	for h := range w.stuck {
		s := time.Duration(h.since.Load())
		if s == 0 || t-s < stalledFor || !h.dst.settled.Load() {
			continue
		}
		cs = append(cs, candidate{h, s})
	}
	slices.SortFunc(cs, func(a, b candidate) int { return cmp.Compare(a.since, b.since) })
	vs := make([]*stallWatch, 0, min(n, len(cs)))
	for _, c := range cs[:min(n, len(cs))] {
		vs = append(vs, c.h)
	}
	return vs
}

func (w *Window) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.t != nil {
		w.t.Stop()
	}
}
