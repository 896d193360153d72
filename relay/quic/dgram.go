package quic

import (
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
// (dgram_control.go), with a hop's queue bounded in time and shared
// round-robin by the sessions, and each datagram sent twice where the link
// loses packets and has room for the copies.
//
// A channel starts once each end heard the other's hello: a peer that does
// not speak it never answers, and its connection's datagrams stay QUIC's.
type dgChannel struct {
	c    *Conn
	e    *Endpoint
	out  *lossyConn
	tx   dgKeys
	rx   dgKeys
	max  atomic.Int64 // largest datagram (flow id included) it takes
	live atomic.Bool  // the peer's hello was heard

	mu      sync.Mutex
	counter uint64
	ring    [dgRingSize]dgSent
	sentPkt uint64 // packets sent, copies included
	sentB   uint64 // bytes sent, copies included
	ctl     dgControl
	queue   dgQueue
	tokens  float64
	filled  time.Time
	pacing  bool // the pacer goroutine runs
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
	got    dgFeedback // what this end received, as it reports it
	gotAt  time.Time  // when got.highest arrived
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

// dgRingSize counters are remembered for the feedback that names them:
// more than a second of datagrams at 100 Mbit/s.
const dgRingSize = 1 << 14

// dgFeedback is what a receiver reports: the highest counter it got and
// how long ago, the packets and bytes it got (copies included), and its
// clock.
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
	// unheardMax datagrams sent over unheardAfter without feedback: the
	// peer no longer gets them, and the connection's datagrams go back to
	// QUIC.
	unheardMax   = 1000
	unheardAfter = 3 * time.Second
	// dgQueueBytes bounds what a channel holds back while it paces.
	dgQueueBytes = 4 << 20
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
	ch := &dgChannel{c: c, e: e, out: out, tx: client, rx: server, epoch: time.Now()}
	if !c.dialed {
		ch.tx, ch.rx = server, client
	}
	ch.max.Store(int64(c.MaxDatagram()))
	if !e.channels.add(ch.rx.id, ch) {
		return
	}
	c.channel.Store(ch)
	go func() {
		<-c.Context().Done()
		e.channels.remove(ch.rx.id)
	}()
	go ch.hello()
}

// hello says hello until the peer's is heard, within helloTries.
func (ch *dgChannel) hello() {
	t := time.NewTicker(helloEvery)
	defer t.Stop()
	for range helloTries {
		if ch.live.Load() {
			return
		}
		ch.sendControl(dgTypeHello, nil)
		select {
		case <-t.C:
		case <-ch.c.Context().Done():
			return
		}
	}
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

// send sends one flow's datagram: now, while the channel need not pace
// and nothing waits; else after what waits, within the lag bound.
func (ch *dgChannel) send(id uint64, payload []byte) error {
	size := quicvarint.Len(id) + len(payload)
	if int64(size) > ch.max.Load() {
		ch.max.Store(int64(ch.c.MaxDatagram()))
		if m := ch.max.Load(); int64(size) > m {
			return &quicgo.DatagramTooLargeError{MaxDatagramPayloadSize: m}
		}
	}
	now := time.Now()
	ch.mu.Lock()
	if ch.unheard > unheardMax && now.Sub(ch.unheardSince) > unheardAfter {
		// Feedback stopped while datagrams went: back to QUIC's, and
		// hello again, which a peer still there answers.
		ch.unheard = 0
		ch.mu.Unlock()
		ch.live.Store(false)
		go ch.hello()
		return ch.c.sendQUICDatagram(id, payload)
	}
	if ch.queue.empty() && ch.mayPassLocked(now, size) {
		pkt, copies := ch.sealLocked(now, id, payload)
		ch.mu.Unlock()
		ch.write(pkt)
		for range copies {
			ch.write(pkt)
		}
		return nil
	}
	if dropped := ch.queue.push(dgQueued{id: id, p: append([]byte(nil), payload...), at: now}, dgQueueBytes); dropped > 0 {
		ch.e.droppedN("queue_full", dropped)
	}
	if !ch.pacing {
		ch.pacing = true
		go ch.pace()
	}
	ch.mu.Unlock()
	return nil
}

// mayPassLocked says whether a datagram of size may go now, taking its
// tokens while paced.
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

func (ch *dgChannel) refillLocked(now time.Time) {
	if !ch.filled.IsZero() {
		burst := max(ch.ctl.rate*0.004, 3000) // 4 ms at the rate
		ch.tokens = min(ch.tokens+ch.ctl.rate*now.Sub(ch.filled).Seconds(), burst)
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
	ch.ring[ch.counter%dgRingSize] = dgSent{counter: ch.counter, at: now, pkts: ch.sentPkt, bytes: ch.sentB}
	if ch.unheard == 0 {
		ch.unheardSince = now
	}
	ch.unheard++
	return pkt, copies
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
			size := quicvarint.Len(q.id) + len(q.p)
			if !ch.mayPassLocked(now, size) {
				break
			}
			ch.queue.pop()
			pkt, copies := ch.sealLocked(now, q.id, q.p)
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

// receive takes one of the channel's packets off the socket.
func (ch *dgChannel) receive(b []byte) {
	typ, counter, payload, err := ch.rx.open(b)
	if err != nil {
		ch.e.dropped("bad_datagram")
		return
	}
	now := time.Now()
	fresh := ch.replay.accept(counter)
	if typ == dgTypeData {
		ch.rmu.Lock()
		ch.got.pkts++
		ch.got.bytes += uint64(len(b))
		if fresh && counter > ch.got.highest {
			ch.got.highest, ch.gotAt = counter, now
		}
		var fb []byte
		if now.Sub(ch.lastFb) >= feedbackEvery {
			ch.lastFb = now
			f := ch.got
			f.delayUs = uint64(now.Sub(ch.gotAt) / time.Microsecond)
			f.clockUs = uint64(now.Sub(ch.epoch) / time.Microsecond)
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
	if !ch.live.Load() {
		ch.live.Store(true)
	}
	switch typ {
	case dgTypeData:
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
		ch.onFeedback(now, f)
	case dgTypeHello:
		// The peer says hello until it hears this end: answer, at most
		// once per helloEvery/2.
		ch.mu.Lock()
		answer := now.Sub(ch.lastHi) >= helloEvery/2
		if answer {
			ch.lastHi = now
		}
		ch.mu.Unlock()
		if answer {
			ch.sendControl(dgTypeHello, nil)
		}
	default:
		ch.e.dropped("bad_datagram")
	}
}

// onFeedback turns the receiver's report into a sample for the controller
// once it covers sampleEvery.
func (ch *dgChannel) onFeedback(now time.Time, f dgFeedback) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.unheard = 0
	sent := ch.ring[f.highest%dgRingSize]
	if sent.counter != f.highest || f.highest == 0 {
		return // too old to judge, or nothing yet
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
	ch.receive(b)
}
