package quic

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/pki"
)

// A flow's sink that blocks (a middle relay's Session.Send that falls back
// to SendFrame, a stream write under flow or congestion control) must not
// hold the socket's reader, which serves every connection on it: another
// peer's (c's) probe is answered while b's sink blocks.
func TestChannelSinkDoesNotHoldTheSocket(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 2)
	a, b, c := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", accepted), testEndpoint(t, ca, "c", nil)
	near, far := connected(t, a, b, accepted)
	waitLive(t, near, far)
	cnear, _ := connected(t, c, b, accepted)
	echoes := make(chan time.Time, 16)
	upperOf(c).echo = func(string, []byte) { echoes <- time.Now() }

	if err := cnear.SendProbe([]byte("p")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-echoes:
	case <-time.After(3 * time.Second):
		t.Fatal("baseline probe unanswered")
	}
	release := make(chan struct{})
	far.Register(8, func([]byte) { <-release })
	if err := near.SendFlowDatagram(8, []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // b's reader is in the sink now
	sent := time.Now()
	if err := cnear.SendProbe([]byte("p")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-echoes:
		t.Logf("probe answered in %v", time.Since(sent))
	case <-time.After(3 * time.Second):
		close(release)
		select {
		case at := <-echoes:
			t.Errorf("another peer's probe waited %v: b's socket reader was held by a's flow's sink", at.Sub(sent))
		case <-time.After(3 * time.Second):
			t.Errorf("another peer's probe was never answered: b's socket reader was held by a's flow's sink for 3 s")
		}
		return
	}
	close(release)
}

// The same with a sink that writes a stream on b's own connection to c (a
// middle relay framing onward): once the congestion window is full the
// write waits for ACKs, which the socket's reader must go on reading.
func TestChannelSinkMayWriteAStream(t *testing.T) { testSinkStreamWrite(t, false) }

// The control: the same without the channel (the sink on the connection's
// datagram goroutine) keeps writing.
func TestQUICSinkMayWriteAStream(t *testing.T) { testSinkStreamWrite(t, true) }

func testSinkStreamWrite(t *testing.T, noChannel bool) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 2)
	var got atomic.Int64
	a := testEndpoint(t, ca, "a", nil)
	b := testEndpointOpts(t, ca, "b", func(c *Conn, s *quicgo.Stream) {
		s.CancelRead(0)
		s.Close()
		accepted <- c
	}, func(o *Options) { o.NoDatagramChannel = noChannel })
	c := testEndpointWith(t, ca, "c", func(_ *Conn, s *quicgo.Stream) {
		n, _ := io.Copy(io.Discard, s)
		got.Add(n)
	})
	near, far := connected(t, a, b, accepted)
	if !noChannel {
		waitLive(t, near, far)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	onward, err := b.Links().Link("c", Control, []string{c.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := onward.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	far.Register(8, func(p []byte) {
		frame := make([]byte, 1200)
		if n, err := s.Write(frame); err == nil {
			written.Add(int64(n))
		}
	})
	var sentN int
	for i := range 3000 {
		if near.SendFlowDatagram(8, make([]byte, 1000)) == nil {
			sentN++
		}
		if i%20 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for written.Load() < int64(sentN)*1200/2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if w := written.Load(); w < int64(sentN)*1200/2 {
		t.Errorf("b's sink wrote only %d of %d bytes in 5 s: the stream write blocked b's reader, which must read the ACKs that unblock it", w, sentN*1200)
	}
}

// One direction of the channel dropped (a QUIC-aware middlebox that drops
// packets with the fixed bit clear, toward b only): a low-rate flow goes
// back to QUIC's datagrams within a second or so, and arrives.
func TestChannelOneWayLossLowRate(t *testing.T) {
	_, b, near, far := livePair(t)
	b.channels.remove(far.channel.Load().rx.id) // a's channel packets now die at b
	var got atomic.Int64
	far.Register(8, func([]byte) { got.Add(1) })
	const n = 200 // 50 a second, 4 s
	for range n {
		near.SendFlowDatagram(8, []byte("voice"))
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	t.Logf("b got %d of %d; a's channel usable: %v", got.Load(), n, near.channel.Load().usable())
	// A second of them goes before the channel gives up: 50 of 200.
	if got.Load() < n*65/100 {
		t.Errorf("b got %d of %d datagrams over 4 s: a kept sending into a channel b never heard", got.Load(), n)
	}
}

// As above at a high rate with b sending to a the while: b's packets,
// which still arrive, do not make a's channel live again after it went
// back to QUIC's.
func TestChannelOneWayLossTwoWayFlow(t *testing.T) {
	_, b, near, far := livePair(t)
	b.channels.remove(far.channel.Load().rx.id)
	var got atomic.Int64
	far.Register(8, func([]byte) { got.Add(1) })
	near.Register(12, func([]byte) {})
	stop := make(chan struct{})
	go func() { // b's side of the conversation, on b's (working) direction
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				far.SendFlowDatagram(12, []byte("back"))
			}
		}
	}()
	const n = 5000 // 1 a millisecond, 5 s or more
	for range n {
		near.SendFlowDatagram(8, []byte("forward"))
		time.Sleep(time.Millisecond)
	}
	close(stop)
	time.Sleep(300 * time.Millisecond)
	t.Logf("b got %d of %d", got.Load(), n)
	if got.Load() < n*65/100 {
		t.Errorf("b got %d of %d: after each fallback b's next packet made a's channel live again", got.Load(), n)
	}
}

// Once the connection is closed, a datagram fails as QUIC's would: the
// session learns its hop is gone.
func TestChannelSendAfterClose(t *testing.T) {
	_, _, near, _ := livePair(t)
	near.CloseWithError(0, "bye")
	<-near.Context().Done()
	if err := near.SendFlowDatagram(8, []byte("x")); err == nil {
		t.Errorf("a datagram on a closed connection: no error (QUIC's path returns %v)", near.sendQUICDatagram(8, []byte("x")))
	}
}

// Paced, the token bucket counts what goes on the wire, as the receiver
// measures the rate: with small datagrams the channel's overhead is a
// third of it.
func TestPacerCountsTheWire(t *testing.T) {
	tx, _, err := channelKeys(make([]byte, 2*dgKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	ch := &dgChannel{tx: tx}
	ch.ctl.paced, ch.ctl.rate = true, 1e6 // bytes a second, as measured on the wire
	now := time.Now()
	onWire := 0
	payload := make([]byte, 100)
	for ms := range 1000 {
		at := now.Add(time.Duration(ms) * time.Millisecond)
		for range 50 { // the application offers more than the rate
			if ch.mayPassLocked(at, wire(1+len(payload), 0)) {
				pkt, _ := ch.sealLocked(at, 8, payload)
				onWire += len(pkt)
			}
		}
	}
	if float64(onWire) > 1.05*ch.ctl.rate {
		t.Errorf("paced at %.0f B/s the channel sent %d B/s on the wire", ch.ctl.rate, onWire)
	}
}

// A link that loses 3% at random and never queues, a 20 Mbit/s flow of
// 1200-byte datagrams: the loss is learnt as the link's usual, and does
// not pace the channel.
func TestControlLearnsLargeRandomLoss(t *testing.T) {
	var c dgControl
	start := time.Now()
	const app = 2_500_000.0 // payload bytes a second offered
	const size, onWire = 1201.0, 1234.0
	for i := range 1200 { // 60 s of 50 ms samples
		now := start.Add(time.Duration(i) * 50 * time.Millisecond)
		rate := app
		if c.paced {
			rate = min(app, c.rate)
			if c.rate < app {
				c.backlogAt = now
			}
		}
		sent := rate / size * 0.05
		c.onSample(now, dgSample{rtt: 100 * time.Millisecond, sent: sent, lost: 0.03 * sent,
			delivered: 0.97 * sent * onWire / 0.05, offered: sent * onWire / 0.05})
	}
	t.Logf("after 60 s: paced %v at %.0f B/s (app %.0f), base loss judged %v", c.paced, c.rate, app, c.baseJudged)
	if c.paced && c.rate < 0.9*app {
		t.Errorf("a healthy link with 3%% random loss: paced at %.0f B/s for 60 s, the application sends %.0f", c.rate, app)
	}
}

// A pacer whose sleeps a busy host stretches (1 ms asked, 12 taken) still
// sends at its rate: the tokens of the long sleep are kept while
// datagrams wait.
func TestPacerKeepsItsRateThroughLongSleeps(t *testing.T) {
	tx, _, err := channelKeys(make([]byte, 2*dgKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	ch := &dgChannel{tx: tx}
	ch.ctl.paced, ch.ctl.rate = true, 1e6 // bytes a second
	now := time.Now()
	payload := make([]byte, 1000)
	for range 1200 { // more waiting than the rate takes
		ch.queue.push(dgQueued{id: 8, p: payload, at: now}, 1<<30)
	}
	sent := 0
	for step := range 84 { // a second of 12 ms sleeps
		at := now.Add(time.Duration(step) * 12 * time.Millisecond)
		for !ch.queue.empty() && ch.mayPassLocked(at, wire(1+len(payload), 0)) {
			ch.queue.pop()
			sent += wire(1+len(payload), 0)
		}
	}
	if float64(sent) < 0.9*ch.ctl.rate {
		t.Errorf("paced at %.0f B/s with 12 ms sleeps, the channel sent %d in a second", ch.ctl.rate, sent)
	}
}
