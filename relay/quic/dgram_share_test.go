package quic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/pki"
)

// TestChannelSharesACongestedLinkByTunnel: one connection's datagram
// channel carries Tunnel many's 32 sessions and Tunnel lone's 1 over a
// 20 Mbit/s link, each Tunnel offering about twice the link. The channel
// paces to the link and its queue takes the Tunnels in turn: lone gets
// about half of what arrives, not the 1/33 that turns by session gave it.
// Shares are judged, not rates, and loosely (40%), for a busy host.
func TestChannelSharesACongestedLinkByTunnel(t *testing.T) {
	const linkBps = 20e6
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Conn, 1)
	a, b := testEndpoint(t, ca, "a", nil), testEndpoint(t, ca, "b", accepted)
	link, err := linkemu.NewUDPProxy("127.0.0.1:0", b.Addr().String(), linkemu.Params{Rate: linkBps, Delay: 2 * time.Millisecond, Queue: 80 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	near, far := connectedAt(t, a, b, accepted, link.Addr())
	waitLive(t, near, far)

	var manyGot, loneGot atomic.Int64
	var manyLost, loneLost atomic.Int64
	many := &Share{Key: "ns/many", Dropped: func(n int) { manyLost.Add(int64(n)) }}
	lone := &Share{Key: "ns/lone", Dropped: func(n int) { loneLost.Add(int64(n)) }}
	const loneID = 4 * 1000
	for i := range 32 {
		far.Register(uint64(4*(i+1)), func(p []byte) { manyGot.Add(int64(len(p))) })
	}
	far.Register(loneID, func(p []byte) { loneGot.Add(int64(len(p))) })

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	// Each Tunnel offers 1000-byte datagrams, 10 every 2 ms: 40 Mbit/s.
	// A tick a busy host stretches costs both alike.
	go func() {
		defer close(done)
		p := make([]byte, 1000)
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		next := 0
		for ctx.Err() == nil {
			<-tk.C
			for range 10 {
				near.sendFlowDatagram(uint64(4*(next+1)), many, p)
				next = (next + 1) % 32
				near.sendFlowDatagram(loneID, lone, p)
			}
		}
	}()
	// The channel learns the link and paces; then shares are measured.
	time.Sleep(2 * time.Second)
	manyGot.Store(0)
	loneGot.Store(0)
	time.Sleep(2 * time.Second)
	m, l := float64(manyGot.Load()), float64(loneGot.Load())
	stop()
	<-done
	ch := near.channel.Load()
	ch.mu.Lock()
	paced, rate := ch.ctl.paced, ch.ctl.rate
	ch.mu.Unlock()
	t.Logf("over 2 s: many %.1f Mbit/s, lone %.1f Mbit/s; the channel paced %v at %.1f Mbit/s; dropped many %d, lone %d bytes",
		m*8/2e6, l*8/2e6, paced, rate*8/1e6, manyLost.Load(), loneLost.Load())
	if m+l == 0 {
		t.Fatal("nothing arrived")
	}
	if share := l / (m + l); share < 0.4 {
		t.Errorf("lone's 1 session got %.1f%% of what arrived beside many's 32, want 40%% or more", 100*share)
	}
	if manyLost.Load() == 0 {
		t.Error("the channel never told many's sessions of a datagram it dropped")
	}
}
