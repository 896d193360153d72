package relay

import (
	"net/netip"
	"testing"
	"time"
)

// A pinger hears its destination's replies, to its own requests only,
// whichever socket the relay may open (here, as root in a namespace whose
// ping_group_range holds no group, a raw one).
func TestPingerLoopback(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "::1"} {
		t.Run(a, func(t *testing.T) {
			p, err := openPinger(netip.MustParseAddr(a))
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			got := make(chan uint16, 8)
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.receive(func(seq uint16, data []byte) {
					if string(data) == "hoplink" {
						got <- seq
					}
				}, func() bool { return false })
			}()
			if err := p.send(7, []byte("hoplink")); err != nil {
				t.Fatal(err)
			}
			select {
			case seq := <-got:
				if seq != 7 {
					t.Fatalf("reply to seq %d; want 7", seq)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("no reply from loopback")
			}
			// A reply no request waits for is not passed on.
			if p.wait.take(7) {
				t.Fatal("a request still waits after its reply")
			}
			p.close()
			<-done
		})
	}
}

// A session waits on a bounded number of requests, each for a while.
func TestEchoWait(t *testing.T) {
	var w echoWait
	for seq := range uint16(maxOutstanding + 10) {
		w.add(seq)
	}
	if len(w.sent) > maxOutstanding {
		t.Fatalf("%d requests wait; at most %d may", len(w.sent), maxOutstanding)
	}
	if !w.take(maxOutstanding+9) || w.take(maxOutstanding+9) {
		t.Fatal("the last request's reply not passed on exactly once")
	}
	w.sent[1] = time.Now().Add(-2 * echoTimeout)
	if w.take(1) {
		t.Fatal("a reply after the timeout passed on")
	}
}
