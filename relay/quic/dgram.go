package quic

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/hoplink/hoplink/relay/hop"
)

// A channel carries a connection's UDP datagrams (hop.AppendDatagram's
// encoding) beside QUIC rather than in it. quic-go sends DATAGRAM frames
// under its loss-based congestion control, which on a long leg that loses
// 1% at random allows a few Mbit/s: past that a UDP Tunnel's datagrams
// queued for seconds, then most were dropped. quic-go has no pluggable
// controller, so the relays send these packets themselves, on the same
// socket and 5-tuple, authenticated and encrypted with keys only the two
// ends of the QUIC connection hold (dgram_wire.go), at the rate the
// application sends, paced only when the link shows congestion
// (dgram_control.go), with a hop's queue bounded in time and shared by
// Tunnel, then by session (dgQueue), and each datagram sent twice where
// the link loses packets and has room for the copies.
//
// An end sends on the channel once it knows the peer hears it: the peer's
// hello said it heard this end's, or the peer's feedback or datagrams came
// (it sends them only once it knows as much). A peer that does not speak
// the channel never answers, and its connection's datagrams stay QUIC's.
// A channel whose datagrams go unanswered goes back to QUIC's and hellos
// again: a path that drops what is not QUIC (one way or both) costs a
// second of datagrams, not the session.
type dgChannel struct {
	c    *Conn
	e    *Endpoint
	out  *lossyConn
	tx   dgKeys
	rx   dgKeys
	max  atomic.Int64 // largest datagram (flow id included) it takes
	live atomic.Bool  // the peer hears this end: datagrams go here
	// fresh: since going back to QUIC's, only a hello saying the peer
	// heard this end's makes the channel live again, not the peer's
	// datagrams (a path that drops only this end's packets).
	fresh atomic.Bool
	// heard: a packet of the peer's arrived (since the channel last went
	// back to QUIC's), so this end's hellos say so.
	heard atomic.Bool
	// in holds packets off the socket for the channel's goroutine: the
	// socket's reader serves every connection on it and never waits on
	// a flow's sink.
	in chan []byte

	mu      sync.Mutex
	counter uint64
	ring    []dgSent // made at the first datagram: a channel that carries none costs little
	sentPkt uint64   // packets sent, copies included
	sentB   uint64   // bytes sent, copies included
	ctl     dgControl
	queue   dgQueue
	// sentBy is the payload bytes each Share's sessions sent since the
	// last sample, for sharing out the loss the sample shows (onFeedback).
	sentBy map[*Share]int
	tokens float64
	filled time.Time
	pacing bool // the pacer goroutine runs
	// The feedback interval being measured: the feedback that opened it
	// and what had been sent up to its highest counter.
	fbOpen       dgFeedback
	fbSent       dgSent
	fbRTT        time.Duration // the least round trip of the interval's feedback
	unheard      int           // datagrams sent since the last feedback
	unheardSince time.Time     // when the first of them went
	lastHi       time.Time     // when this end last answered a hello

	replay replayWindow
	rmu    sync.Mutex
	got    dgFeedback // what this end reports: counts as of got.highest's arrival
	gotAt  time.Time  // when got.highest arrived
	top    uint64     // the highest data counter that arrived
	rxPkts uint64     // data packets received, copies included
	rxB    uint64     // their bytes
	epoch  time.Time
	lastFb time.Time
}

// dgSent records what had been sent when a counter went.
type dgSent struct {
	counter uint64
	at      time.Time
	pkts    uint64
	bytes   uint64
}

// Every dgRingStep-th counter is remembered, dgRingSize of them, for the
// feedback that names a counter near it: 32,768 datagrams, a round trip
// of 300 ms at 100,000 a second.
const (
	dgRingSize = 1 << 12
	dgRingStep = 8
)

// dgFeedback is what a receiver reports: the highest data counter it got
// of those the sender remembers (a multiple of dgRingStep) and how long
// ago, and, as of that counter's arrival, the packets and bytes it got
// (copies included) and its clock.
type dgFeedback struct {
	highest uint64
	delayUs uint64
	pkts    uint64
	bytes   uint64
	clockUs uint64
}

const dgFeedbackLen = 5 * 8

func (f dgFeedback) append(b []byte) []byte {
	for _, v := range []uint64{f.highest, f.delayUs, f.pkts, f.bytes, f.clockUs} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

func parseFeedback(b []byte) (f dgFeedback, err error) {
	if len(b) != dgFeedbackLen {
		return f, errChannelPacket
	}
	for i, p := range []*uint64{&f.highest, &f.delayUs, &f.pkts, &f.bytes, &f.clockUs} {
		*p = binary.BigEndian.Uint64(b[8*i:])
	}
	return f, nil
}

const (
	// feedbackEvery is how often a receiver reports while datagrams come.
	feedbackEvery = 25 * time.Millisecond
	// sampleEvery is the least interval between two feedbacks the
	// controller judges.
	sampleEvery = 50 * time.Millisecond
	// helloEvery and helloTries bound the hellos one end sends.
	helloEvery = 250 * time.Millisecond
	helloTries = 20
	// A receiver answers each datagram within feedbackEvery; two or more
	// sent without an answer for unheardAfter (or four round trips, if
	// longer) say the peer no longer gets them, and the connection's
	// datagrams go back to QUIC's.
	unheardAfter = time.Second
	// dgQueueBytes bounds what a channel holds back while it paces, in
	// bytes on the wire.
	dgQueueBytes = 4 << 20
	// dgInQueue bounds the packets waiting for the channel's goroutine.
	dgInQueue = 1024
	// copyHorizon: a counter this far behind the highest that arrives
	// again is a replay, not a copy, and does not count as received.
	copyHorizon = 64
)

// startChannel derives the connection's channel and says hello, where the
// socket takes the channel's packets out before quic-go.
func (c *Conn) startChannel(e *Endpoint) {
	out := e.channelSocket(c.dialed)
	if out == nil {
		return
	}
	st := c.ConnectionState()
	material, err := st.TLS.ExportKeyingMaterial(dgExporterLabel, nil, 2*dgKeyLen)
	if err != nil {
		return
	}
	client, server, err := channelKeys(material)
	if err != nil {
		return
	}
	ch := &dgChannel{c: c, e: e, out: out, tx: client, rx: server, epoch: time.Now(), in: make(chan []byte, dgInQueue)}
	if !c.dialed {
		ch.tx, ch.rx = server, client
	}
	ch.max.Store(int64(c.MaxDatagram()))
	if !e.channels.add(ch.rx.id, ch) {
		return
	}
	c.channel.Store(ch)
	go ch.run()
	go ch.hello()
}

// run takes the channel's packets off the socket's reader until the
// connection ends.
func (ch *dgChannel) run() {
	defer ch.e.channels.remove(ch.rx.id)
	done := ch.c.Context().Done()
	for {
		select {
		case b := <-ch.in:
			ch.receive(b)
		case <-done:
			return
		}
	}
}

// hello says hello until the peer hears this end, within helloTries.
func (ch *dgChannel) hello() {
	t := time.NewTicker(helloEvery)
	defer t.Stop()
	for range helloTries {
		if ch.live.Load() {
			return
		}
		ch.sendHello()
		select {
		case <-t.C:
		case <-ch.c.Context().Done():
			return
		}
	}
}

// sendHello says hello, and whether this end heard the peer.
func (ch *dgChannel) sendHello() {
	heard := byte(0)
	if ch.heard.Load() {
		heard = 1
	}
	ch.sendControl(dgTypeHello, []byte{heard})
}

func (ch *dgChannel) sendControl(typ byte, payload []byte) {
	ch.mu.Lock()
	ch.counter++
	pkt := ch.tx.seal(make([]byte, 0, dgOverhead+len(payload)), typ, ch.counter, payload)
	ch.mu.Unlock()
	ch.write(pkt)
}

func (ch *dgChannel) write(pkt []byte) {
	ua, _ := ch.c.RemoteAddr().(*net.UDPAddr)
	if ua == nil {
		return
	}
	if _, _, err := ch.out.writeMsg(pkt, nil, ua); err != nil {
		if reason := lostReason(err); reason != "" {
			ch.out.lost(reason)
		}
	}
}

// usable says whether datagrams go on the channel now.
func (ch *dgChannel) usable() bool { return ch != nil && ch.live.Load() }

// wire is what a datagram of size (flow id included) takes on the link,
// copies included.
func wire(size, copies int) int { return (dgOverhead + size) * (1 + copies) }

// send sends one flow's datagram: now, while the channel need not pace
// and nothing waits; else after what waits, within the lag bound.
func (ch *dgChannel) send(id uint64, sh *Share, payload []byte) error {
	size := quicvarint.Len(id) + len(payload)
	if int64(size) > ch.max.Load() {
		ch.max.Store(int64(ch.c.MaxDatagram()))
		if m := ch.max.Load(); int64(size) > m {
			return &quicgo.DatagramTooLargeError{MaxDatagramPayloadSize: m}
		}
	}
	if err := ch.c.Context().Err(); err != nil {
		return context.Cause(ch.c.Context())
	}
	now := time.Now()
	ch.mu.Lock()
	if ch.unheard >= 2 && now.Sub(ch.unheardSince) > max(unheardAfter, 4*ch.ctl.roundTrip()) {
		// No answer: back to QUIC's, and hello again, which a peer
		// that hears this end answers.
		ch.unheard = 0
		ch.mu.Unlock()
		// What this end heard so far proves nothing now: its hellos say
		// it heard the peer only once a packet arrives again.
		ch.heard.Store(false)
		ch.fresh.Store(true)
		ch.live.Store(false)
		ch.e.opts.Log.Info("UDP datagrams to the peer went unanswered: they ride QUIC until the datagram channel answers again", "peer", ch.c.Peer)
		go ch.hello()
		return ch.c.sendQUICDatagram(id, payload)
	}
	if ch.queue.empty() && ch.mayPassLocked(now, wire(size, ch.copiesLocked())) {
		pkt, copies := ch.sealLocked(now, id, payload)
		ch.sentByLocked(sh, len(payload))
		ch.mu.Unlock()
		ch.write(pkt)
		for range copies {
			ch.write(pkt)
		}
		return nil
	}
	if dropped := ch.queue.push(dgQueued{id: id, p: append([]byte(nil), payload...), at: now, sh: sh}, dgQueueBytes); dropped > 0 {
		ch.e.droppedN("queue_full", dropped)
	}
	if !ch.pacing {
		ch.pacing = true
		go ch.pace()
	}
	ch.mu.Unlock()
	return nil
}

func (ch *dgChannel) copiesLocked() int {
	if ch.ctl.copies {
		return 1
	}
	return 0
}

// mayPassLocked says whether size bytes on the wire may go now, taking
// their tokens while paced.
func (ch *dgChannel) mayPassLocked(now time.Time, size int) bool {
	if !ch.ctl.paced {
		return true
	}
	ch.refillLocked(now)
	if ch.tokens < float64(size) {
		ch.ctl.backlogAt = now
		return false
	}
	ch.tokens -= float64(size)
	return true
}

// refillLocked adds the tokens the rate earned since the last refill. An
// idle channel keeps 4 ms of them (a burst the link's queue absorbs); one
// with datagrams waiting keeps up to 50 ms, since its pacer sleeps a
// millisecond that a busy host stretches to tens: capped at 4 ms, a pacer
// that slept 12 sent a third of its rate.
func (ch *dgChannel) refillLocked(now time.Time) {
	if !ch.filled.IsZero() {
		keep := 0.004
		if !ch.queue.empty() {
			keep = 0.050
		}
		ch.tokens = min(ch.tokens+ch.ctl.rate*now.Sub(ch.filled).Seconds(), max(ch.ctl.rate*keep, 3000))
	}
	ch.filled = now
}

// sealLocked numbers and seals a datagram, records it for the feedback
// that will name it, and says how many copies go after it.
func (ch *dgChannel) sealLocked(now time.Time, id uint64, payload []byte) (pkt []byte, copies int) {
	ch.counter++
	plain := hop.AppendDatagram(make([]byte, 0, 8+len(payload)), id, payload)
	pkt = ch.tx.seal(make([]byte, 0, dgOverhead+len(plain)), dgTypeData, ch.counter, plain)
	if ch.ctl.copies {
		copies = 1
		ch.e.copied()
	}
	ch.sentPkt += uint64(1 + copies)
	ch.sentB += uint64((1 + copies) * len(pkt))
	if ch.counter%dgRingStep == 0 {
		if ch.ring == nil {
			ch.ring = make([]dgSent, dgRingSize)
		}
		ch.ring[(ch.counter/dgRingStep)%dgRingSize] = dgSent{counter: ch.counter, at: now, pkts: ch.sentPkt, bytes: ch.sentB}
	}
	if ch.unheard == 0 {
		ch.unheardSince = now
	}
	ch.unheard++
	return pkt, copies
}

// sentByLocked counts n payload bytes of sh's sent (sh may be nil).
func (ch *dgChannel) sentByLocked(sh *Share, n int) {
	if sh == nil || sh.Lost == nil {
		return
	}
	if ch.sentBy == nil {
		ch.sentBy = map[*Share]int{}
	}
	if _, ok := ch.sentBy[sh]; !ok && len(ch.sentBy) >= dgSentByMax {
		// Feedback that never makes a sample (a peer that sends none
		// worth one) would keep every session's Share that ever sent:
		// the interval's loss goes unshared instead.
		clear(ch.sentBy)
	}
	ch.sentBy[sh] += n
}

// dgSentByMax bounds the Shares a channel counts bytes for between samples
// (sentBy): sessions a Tunnel's clients open and close come and go.
const dgSentByMax = 1 << 16

// shareLossLocked tells each Share of the bytes the link lost of what its
// sessions sent since the last sample: the sample's loss, shared out by
// bytes sent. Datagrams the link drops past this relay are otherwise
// counted as carried, and a Tunnel that offers twice the link would seem
// to carry twice what it does. While copies go the packets' loss is taken
// for the datagrams': where a queue overflows both copies of a datagram,
// sent back to back, go (random loss, which copies repair, is small).
func (ch *dgChannel) shareLossLocked(s dgSample) {
	if s.lost > 0 && s.sent > 0 {
		f := min(s.lost/s.sent, 1)
		for sh, n := range ch.sentBy {
			if lost := int(f * float64(n)); lost > 0 {
				sh.Lost(lost)
			}
		}
	}
	clear(ch.sentBy)
}

// pace sends what waits as the rate allows, dropping what waited past the
// lag bound, until nothing waits.
func (ch *dgChannel) pace() {
	var pkts [][]byte
	for {
		now := time.Now()
		ch.mu.Lock()
		if late := ch.queue.expire(now.Add(-ch.ctl.lagBound())); late > 0 {
			ch.e.droppedN("late", late)
		}
		pkts = pkts[:0]
		for !ch.queue.empty() {
			q := ch.queue.head()
			if !ch.mayPassLocked(now, wire(quicvarint.Len(q.id)+len(q.p), ch.copiesLocked())) {
				break
			}
			ch.queue.pop()
			pkt, copies := ch.sealLocked(now, q.id, q.p)
			ch.sentByLocked(q.sh, len(q.p))
			for range 1 + copies {
				pkts = append(pkts, pkt)
			}
		}
		if ch.queue.empty() {
			ch.pacing = false
		}
		stop := !ch.pacing
		ch.mu.Unlock()
		for _, p := range pkts {
			ch.write(p)
		}
		if stop || ch.c.Context().Err() != nil {
			if stop {
				return
			}
			ch.mu.Lock()
			ch.queue = dgQueue{}
			ch.pacing = false
			ch.mu.Unlock()
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// receive handles one of the channel's packets, on the channel's
// goroutine.
func (ch *dgChannel) receive(b []byte) {
	typ, counter, payload, err := ch.rx.open(b)
	if err != nil {
		ch.e.dropped("bad_datagram")
		return
	}
	now := time.Now()
	fresh := ch.replay.accept(counter)
	ch.heard.Store(true)
	if typ == dgTypeData {
		ch.rmu.Lock()
		// A copy counts as received (the sender counts the copies it
		// sent); an old counter again is a replay, and does not.
		if fresh || counter+copyHorizon > ch.top {
			ch.rxPkts++
			ch.rxB += uint64(len(b))
		}
		if fresh && counter > ch.top {
			ch.top = counter
		}
		// The sender remembers every dgRingStep-th counter: the
		// feedback names the highest of those that arrived.
		// The counts go with it, as of its arrival: the sender's
		// record of the counter says what went before it, so the two
		// match whenever the feedback is sent.
		if fresh && counter%dgRingStep == 0 && counter > ch.got.highest {
			ch.got = dgFeedback{highest: counter, pkts: ch.rxPkts, bytes: ch.rxB, clockUs: uint64(now.Sub(ch.epoch) / time.Microsecond)}
			ch.gotAt = now
		}
		var fb []byte
		if now.Sub(ch.lastFb) >= feedbackEvery {
			ch.lastFb = now
			f := ch.got
			f.delayUs = uint64(now.Sub(ch.gotAt) / time.Microsecond)
			fb = f.append(make([]byte, 0, dgFeedbackLen))
		}
		ch.rmu.Unlock()
		if fb != nil {
			ch.sendControl(dgTypeFeedback, fb)
		}
	}
	if !fresh {
		return // a copy, or a replay
	}
	switch typ {
	case dgTypeData:
		ch.peerHears(false)
		id, p, err := hop.ParseDatagram(payload)
		if err != nil || id%4 != 0 { // a session's flow id, never a control one
			ch.e.dropped("bad_datagram")
			return
		}
		ch.c.deliver(ch.e, id, p)
	case dgTypeFeedback:
		f, err := parseFeedback(payload)
		if err != nil {
			ch.e.dropped("bad_datagram")
			return
		}
		ch.peerHears(false)
		ch.onFeedback(now, f)
	case dgTypeHello:
		if len(payload) != 1 {
			ch.e.dropped("bad_datagram")
			return
		}
		if payload[0] == 1 {
			ch.peerHears(true)
		}
		// The peer says hello until it hears this end: answer, at most
		// once per helloEvery/2.
		ch.mu.Lock()
		answer := now.Sub(ch.lastHi) >= helloEvery/2
		if answer {
			ch.lastHi = now
		}
		ch.mu.Unlock()
		if answer {
			ch.sendHello()
		}
	default:
		ch.e.dropped("bad_datagram")
	}
}

// peerHears records that the peer hears this end: its hello said so
// (byHello), or it sent what it sends only once it knew, which counts
// only until the channel went back to QUIC's.
func (ch *dgChannel) peerHears(byHello bool) {
	if ch.live.Load() || !byHello && ch.fresh.Load() {
		return
	}
	ch.mu.Lock()
	ch.unheard = 0
	ch.mu.Unlock()
	ch.fresh.Store(false)
	ch.live.Store(true)
}

// onFeedback turns the receiver's report into a sample for the controller
// once it covers sampleEvery.
func (ch *dgChannel) onFeedback(now time.Time, f dgFeedback) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.unheard = 0
	at := f.highest
	if ch.ring == nil || at == 0 || at%dgRingStep != 0 {
		return
	}
	sent := ch.ring[(at/dgRingStep)%dgRingSize]
	if sent.counter != at {
		return // too old to judge
	}
	// The interval's least round trip: one packet's can carry a stall of
	// either relay, the least of a few is the path's.
	if rtt := now.Sub(sent.at) - time.Duration(f.delayUs)*time.Microsecond; rtt > 0 && (ch.fbRTT == 0 || rtt < ch.fbRTT) {
		ch.fbRTT = rtt
	}
	open := ch.fbOpen
	if open.clockUs == 0 || f.clockUs <= open.clockUs || sent.pkts < ch.fbSent.pkts {
		ch.fbOpen, ch.fbSent = f, sent
		return
	}
	dt := time.Duration(f.clockUs-open.clockUs) * time.Microsecond
	if dt < sampleEvery {
		return
	}
	s := dgSample{rtt: ch.fbRTT, sent: float64(sent.pkts - ch.fbSent.pkts)}
	ch.fbRTT = 0
	if got := float64(f.pkts - open.pkts); got < s.sent {
		s.lost = s.sent - got
	}
	s.delivered = float64(f.bytes-open.bytes) / dt.Seconds()
	ch.shareLossLocked(s)
	if span := sent.at.Sub(ch.fbSent.at); span > 0 {
		s.offered = float64(sent.bytes-ch.fbSent.bytes) / span.Seconds()
	}
	ch.ctl.onSample(now, s)
	ch.fbOpen, ch.fbSent = f, sent
}

// channels are an endpoint's channels by the id their packets carry.
type channels struct {
	mu sync.RWMutex
	m  map[uint64]*dgChannel
}

func (cs *channels) add(id uint64, ch *dgChannel) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[uint64]*dgChannel{}
	}
	if _, taken := cs.m[id]; taken {
		return false // 2^-64: that connection's datagrams stay QUIC's
	}
	cs.m[id] = ch
	return true
}

func (cs *channels) remove(id uint64) {
	cs.mu.Lock()
	delete(cs.m, id)
	cs.mu.Unlock()
}

// packet routes a channel packet the socket read to its channel.
func (cs *channels) packet(e *Endpoint, b []byte) {
	id, ok := channelID(b)
	if !ok {
		e.dropped("bad_datagram")
		return
	}
	cs.mu.RLock()
	ch := cs.m[id]
	cs.mu.RUnlock()
	if ch == nil {
		e.dropped("no_session")
		return
	}
	select {
	case ch.in <- append([]byte(nil), b...): // b is the reader's buffer
	default:
		e.dropped("queue_full")
	}
}
