package tlslink

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// Quick never queues for a handshake slot: with every slot taken it gives
// up at once, where with one free it dials (here a peer that never
// answers a handshake, so the dial lasts until the context ends, or
// quickDial), and gives the slot back.
func TestQuickDoesNotQueueForAHandshake(t *testing.T) {
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	a := endpoint(t, ca, "a", m, make(chan accepted, 8))
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	p := a.Pools().Pool("b", []string{mute.Addr().String()})

	for range poolDials {
		p.dialing <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c := p.Quick(ctx); c != nil {
		t.Fatal("a connection from a peer that answers no handshake")
	}
	if ctx.Err() != nil {
		t.Fatal("with every handshake slot taken, Quick waited")
	}

	<-p.dialing
	// With a slot free it dials, for half of what its flow's context
	// leaves: the flow keeps the rest for the other transport.
	short, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	if c := p.Quick(short); c != nil {
		t.Fatal("a connection from a peer that answers no handshake")
	}
	if took := time.Since(start); took < 150*time.Millisecond || short.Err() != nil {
		t.Fatalf("with a handshake slot free, Quick gave up after %v (its flow's context: %v); want it to dial for about 200 ms", took, short.Err())
	}
	if n := len(p.dialing); n != poolDials-1 {
		t.Fatalf("%d handshake slots taken after Quick, want %d", n, poolDials-1)
	}

	// A context of its own that outlasts quickDial: the dial gives up
	// within quickDial, and leaves the flow the rest.
	long, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start = time.Now()
	if c := p.Quick(long); c != nil {
		t.Fatal("a connection from a peer that answers no handshake")
	}
	if long.Err() != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Quick took %v of its flow's 10 s", time.Since(start))
	}
}
