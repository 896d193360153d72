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
// answers a handshake, so the dial lasts until the context ends).
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
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if c := p.Quick(short); c != nil {
		t.Fatal("a connection from a peer that answers no handshake")
	}
	if short.Err() == nil {
		t.Fatal("with a handshake slot free, Quick did not dial")
	}
}
