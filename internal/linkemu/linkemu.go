// Package linkemu emulates long links in user space, because this kernel has
// no netem: a UDP proxy (for QUIC between relays) and a TCP proxy (for
// targets and TLS links) that add delay, jitter, loss and a rate limit in
// each direction, changeable while traffic flows. Tests and benchmarks put
// one between two relays by giving the dialing relay the proxy's address as
// its peer's endpoint.
package linkemu

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Params shape one direction of a link.
type Params struct {
	Delay  time.Duration // one way; a round trip through the proxy adds twice this
	Jitter time.Duration // added uniformly in [0, Jitter); packets keep their order
	Loss   float64       // probability of dropping a packet (UDP only)
	Rate   int64         // bits per second; 0 is unlimited
	// Queue bounds how long a packet may wait behind others for the rate,
	// as a router's buffer does: one that would wait longer is dropped
	// (packet links only). Zero leaves only maxQueue as the bound, which at
	// 100 Mbit/s is most of a second of queue.
	Queue time.Duration
}

// Stats count what one direction of a link did with its packets.
type Stats struct {
	Sent     uint64 // delivered, or due to be
	Lost     uint64 // dropped by Loss
	Overflow uint64 // dropped because the queue was full (Queue or maxQueue)
}

// maxQueue bounds the packets (or TCP chunks) in flight in one direction;
// beyond it new ones are dropped, as a full router queue would.
const maxQueue = 8192

// shaper schedules one direction: when each packet leaves.
type shaper struct {
	mu   sync.Mutex
	p    Params
	last time.Time // departure of the previous packet, to keep order and rate
	rng  *rand.Rand
	st   Stats
}

func newShaper(p Params) *shaper {
	return &shaper{p: p, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x1ceb00da))}
}

func (s *shaper) set(p Params) {
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
}

// departure returns when a packet of n bytes arriving now leaves and how
// much late it may go (batch), or false when it is lost or finds the
// queue full.
func (s *shaper) departure(now time.Time, n int) (time.Time, time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p.Loss > 0 && s.rng.Float64() < s.p.Loss {
		s.st.Lost++
		return time.Time{}, 0, false
	}
	at := now.Add(s.p.Delay)
	if s.p.Jitter > 0 {
		at = at.Add(time.Duration(s.rng.Int64N(int64(s.p.Jitter))))
	}
	free := at
	if s.p.Rate > 0 {
		// Serialization: a packet leaves no sooner than the previous one
		// plus its own transmission time.
		tx := time.Duration(int64(n) * 8 * int64(time.Second) / s.p.Rate)
		at = maxTime(at, s.last.Add(tx))
		if s.p.Queue > 0 && at.Sub(free) > s.p.Queue {
			s.st.Overflow++
			return time.Time{}, 0, false
		}
	}
	at = maxTime(at, s.last)
	s.last = at
	s.st.Sent++
	return at, batch(s.p.Delay), true
}

// overflow counts a packet that was scheduled but found no room.
func (s *shaper) overflow() {
	s.mu.Lock()
	s.st.Sent--
	s.st.Overflow++
	s.mu.Unlock()
}

func (s *shaper) stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type packet struct {
	data []byte
	at   time.Time
	// late: how much later it may leave, to go with the packets after it
	// (see batch).
	late time.Duration
}

// batch is, for a link of one-way delay d, how much late a packet may
// leave with others: a 64th of the delay, at most a millisecond. One
// wake-up then delivers the packets that a rate limit spaced apart
// (at 100 Mbit/s a full packet every 120 µs), instead of one wake-up
// each, which cost the emulator more than the packets' system calls.
// Late, not early: a link never takes less than its delay.
func batch(d time.Duration) time.Duration { return min(d/64, time.Millisecond) }

// pipe delivers packets at their departure times, in order.
type pipe struct {
	s    *shaper
	q    chan packet
	send func([]byte)
	done chan struct{}
	once sync.Once
}

func newPipe(p Params, send func([]byte)) *pipe {
	pp := &pipe{s: newShaper(p), q: make(chan packet, maxQueue), send: send, done: make(chan struct{})}
	go pp.run()
	return pp
}

// push queues a copy of data; it reports false when the packet was dropped.
// It may race with close: the queue itself is never closed under it.
func (p *pipe) push(data []byte) bool {
	at, late, ok := p.s.departure(time.Now(), len(data))
	if !ok {
		return false
	}
	select {
	case <-p.done:
		return false
	case p.q <- packet{append([]byte(nil), data...), at, late}:
		return true
	default:
		p.s.overflow()
		return false
	}
}

// close stops delivery; packets still queued are dropped.
func (p *pipe) close() { p.once.Do(func() { close(p.done) }) }

// run delivers until close, or until a single producer closes q (as the
// TCP proxy does after the last chunk, to deliver everything queued).
func (p *pipe) run() {
	t := time.NewTimer(0)
	defer t.Stop()
	pt := newPreciseTimer()
	defer pt.close()
	for {
		var pk packet
		select {
		case <-p.done:
			return
		case got, ok := <-p.q:
			if !ok {
				return
			}
			pk = got
		}
		// A packet not yet due waits out its lateness too; those that fell
		// due meanwhile then follow it without a wake-up of their own.
		if time.Until(pk.at) > 0 && !waitUntil(pk.at.Add(pk.late), t, pt, p.done) {
			return
		}
		p.send(pk.data)
	}
}

// coarse is how late a Go timer may fire: with nothing else to run, the
// runtime's network poller sleeps in whole milliseconds, so a 100 µs timer
// fires after about 1.1 ms and an emulated LAN would be a slow WAN.
const coarse = 2 * time.Millisecond

// waitUntil returns at at, to within tens of microseconds: a Go timer for
// all but the last stretch, then the precise timer. It reports false when
// done closed first.
func waitUntil(at time.Time, t *time.Timer, pt *preciseTimer, done <-chan struct{}) bool {
	for {
		d := time.Until(at)
		if d <= 0 {
			return true
		}
		if d <= coarse {
			pt.sleep(d)
			continue
		}
		t.Reset(d - coarse)
		select {
		case <-t.C:
		case <-done:
			return false
		}
	}
}
