package quic

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/hoplink/hoplink/pki"
)

// connected dials b from a and returns both ends of the connection.
func connected(t *testing.T, a, b *Endpoint, accepted <-chan *Conn) (near, far *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link(b.opts.Name, Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{0})
	select {
	case far = <-accepted:
	case <-ctx.Done():
		t.Fatal("b never saw a's stream")
	}
	return c, far
}

// livePair starts relays a and b and returns both ends of a's connection
// to b, their datagram channel running.
func livePair(t *testing.T) (a, b *Endpoint, near, far *Conn) {
	t.Helper()
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 1)
	a, b = testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", accepted)
	near, far = connected(t, a, b, accepted)
	waitLive(t, near, far)
	return a, b, near, far
}

func waitLive(t *testing.T, cs ...*Conn) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range cs {
		for !c.channel.Load().usable() {
			if time.Now().After(deadline) {
				t.Fatalf("the datagram channel of %s's connection never started", c.Peer)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Datagrams ride the channel, not QUIC, once both ends said hello, in both
// directions, whole; QUIC sends none of them.
func TestChannelCarriesDatagrams(t *testing.T) {
	_, _, near, far := livePair(t)

	const flow, n = 8, 500
	for _, dir := range []struct {
		name     string
		from, to *Conn
	}{{"a to b", near, far}, {"b to a", far, near}} {
		got := make(chan []byte, n)
		dir.to.Register(flow, func(p []byte) { got <- p })
		before := dir.from.ConnectionStats().PacketsSent
		for i := range n {
			p := bytes.Repeat([]byte{byte(i)}, 1000)
			p[0], p[1] = byte(i>>8), byte(i)
			if err := dir.from.SendFlowDatagram(flow, p); err != nil {
				t.Fatal(err)
			}
			if i%50 == 0 {
				time.Sleep(time.Millisecond) // the socket's buffer is the test's, not the channel's
			}
		}
		seen := map[int]bool{}
		timeout := time.After(5 * time.Second)
		for len(seen) < n*95/100 {
			select {
			case p := <-got:
				i := int(p[0])<<8 | int(p[1])
				if len(p) != 1000 || !bytes.Equal(p[2:], bytes.Repeat([]byte{byte(i)}, 998)) {
					t.Fatalf("%s: a datagram arrived changed", dir.name)
				}
				seen[i] = true
			case <-timeout:
				t.Fatalf("%s: %d of %d datagrams arrived", dir.name, len(seen), n)
			}
		}
		if sent := dir.from.ConnectionStats().PacketsSent - before; sent > n/10 {
			t.Errorf("%s: QUIC sent %d packets for %d datagrams: they did not take the channel", dir.name, sent, n)
		}
		dir.to.Unregister(flow)
	}

	// Too large for the path: refused as QUIC refuses it, so the session
	// frames it.
	big := make([]byte, near.MaxDatagram())
	var tooLarge *quicgo.DatagramTooLargeError
	if err := near.SendFlowDatagram(flow, big); err == nil || !asTooLarge(err, &tooLarge) || int(tooLarge.MaxDatagramPayloadSize) != len(big) {
		t.Errorf("a datagram over the limit: %v", err)
	}
	if err := near.SendFlowDatagram(flow, big[:len(big)-quicvarint.Len(flow)]); err != nil {
		t.Errorf("a datagram at the limit: %v", err)
	}
}

// A peer whose socket does not take the channel's packets out (an older
// relay; a kernel without UDP GRO) never answers the hello: datagrams stay
// QUIC's and arrive.
func TestChannelFallsBackToQUIC(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 1)
	a := testEndpoint(t, ca, "a", nil)
	b := testEndpointOpts(t, ca, "b", func(c *Conn, s *quicgo.Stream) {
		s.CancelRead(0)
		s.Close()
		accepted <- c
	}, func(o *Options) { o.NoDatagramChannel = true })
	near, far := connected(t, a, b, accepted)
	time.Sleep(3 * helloEvery)
	if near.channel.Load().usable() || far.channel.Load() != nil {
		t.Fatal("a channel started with a peer that cannot read it")
	}
	got := make(chan []byte, 1)
	far.Register(8, func(p []byte) { got <- p })
	if err := near.SendFlowDatagram(8, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if string(p) != "hello" {
			t.Fatalf("got %q", p)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the datagram never arrived over QUIC")
	}
}

func asTooLarge(err error, target **quicgo.DatagramTooLargeError) bool {
	return errors.As(err, target)
}

// A peer that stops taking the channel's packets (its reader lost them;
// a middlebox began dropping what is not QUIC) costs the datagrams of a
// few seconds at most: without feedback the sender goes back to QUIC's
// datagrams, which arrive.
func TestChannelWithoutFeedbackGoesBackToQUIC(t *testing.T) {
	_, b, near, far := livePair(t)
	got := make(chan []byte, 64)
	far.Register(8, func(p []byte) {
		select {
		case got <- p:
		default:
		}
	})
	b.channels.remove(far.channel.Load().rx.id) // b no longer reads them
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for i := 0; ; i++ {
		if err := near.SendFlowDatagram(8, []byte("after")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			if near.channel.Load().usable() {
				t.Fatal("a datagram arrived on a channel its peer no longer reads")
			}
			if time.Since(start) < unheardAfter {
				t.Fatalf("back to QUIC after %v, before %v without an answer", time.Since(start), unheardAfter)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d datagrams over 10 s, none arrived", i)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// connectedAt is connected, dialing b at addr (a proxy in front of it).
func connectedAt(t *testing.T, a, b *Endpoint, accepted <-chan *Conn, addr string) (near, far *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Links().Link(b.opts.Name, Control, []string{addr}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{0})
	select {
	case far = <-accepted:
	case <-ctx.Done():
		t.Fatal("b never saw a's stream")
	}
	return c, far
}

// Between samples a channel counts what each Share sent; a peer whose
// feedback never makes a sample must not have it keep every session's
// Share that ever sent (each session has its own).
func TestChannelSentByIsBounded(t *testing.T) {
	ch := &dgChannel{}
	for range 1<<16 + 1000 {
		ch.sentByLocked(&Share{Key: "ns/churn", Lost: func(int) {}}, 100)
	}
	if n := len(ch.sentBy); n > 1<<16 {
		t.Errorf("the channel counts %d Shares, want at most %d", n, 1<<16)
	}
}
