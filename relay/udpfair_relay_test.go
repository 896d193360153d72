package relay_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestUDPTunnelsShareALinkFairly: UDP Tunnel many sends over 32 sessions
// beside Tunnel lone, each offering about twice what the link between two
// relays carries (20 Mbit/s, rate-limited both as UDP and as TCP, with a
// router's queue of 80 ms). lone must get 40% of what both deliver:
//   - lone a UDP Tunnel of 1 session, over QUIC: each Tunnel has a QUIC
//     connection of its own to the peer, and so a datagram channel that
//     paces on its own; before UDP sessions joined fair share, how the
//     two channels split the link was up to their controllers and a
//     loaded host's scheduling (lone got two thirds, or a fifth), never
//     capped; now the Tunnel over its share is capped (about half each).
//     Where Tunnels share a connection, its queue takes them in turn:
//     relay/quic's TestChannelSharesACongestedLinkByTunnel;
//   - lone a TCP Tunnel of 1 flow: many's datagrams, which no congestion
//     control of the TCP flow's holds back, took all but 1% of the link
//     until UDP sessions joined their Tunnel's fair share; now many is
//     capped at its share and its datagrams over the cap dropped
//     (fair_share).
//
// Shares, not rates, are judged, loosely, for a busy host.
func TestUDPTunnelsShareALinkFairly(t *testing.T) {
	for _, lone := range []string{"udp", "tcp"} {
		t.Run("beside a "+lone+" Tunnel", func(t *testing.T) { udpShare(t, lone) })
	}
}

func udpShare(t *testing.T, loneProtocol string) {
	const linkBps = 20e6
	var manyGot, loneGot atomic.Int64
	udpSink := func(n *atomic.Int64) string {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		pc.SetReadBuffer(4 << 20)
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65535)
			for {
				m, err := pc.Read(buf)
				if err != nil {
					return
				}
				n.Add(int64(m))
			}
		}()
		return pc.LocalAddr().String()
	}
	many, lone := udpSink(&manyGot), ""
	if loneProtocol == "udp" {
		lone = udpSink(&loneGot)
	} else {
		lone = testutil.TCPServer(t, func(c *net.TCPConn) {
			buf := make([]byte, 64<<10)
			for {
				m, err := c.Read(buf)
				loneGot.Add(int64(m))
				if err != nil {
					return
				}
			}
		})
	}
	link := newSharedLink(t, linkBps)
	exitPort, pM, pL := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	exitAddr := fmt.Sprintf("127.0.0.1:%d", exitPort)
	link.target.Store(&exitAddr)
	// A queue of 80 ms, as a router's: past it packets are dropped, and
	// the datagram channel reads the delay as congestion.
	udp, err := linkemu.NewUDPProxy(link.Addr().String(), exitAddr, linkemu.Params{Rate: linkBps, Delay: 2 * time.Millisecond, Queue: 80 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	// Datagram mode: every packet rides a datagram, never the session's
	// stream.
	loneSpec := testutil.TunnelSpec{Name: "lone", Protocol: loneProtocol, Target: lone, Port: pL}
	if loneProtocol == "udp" {
		loneSpec.Extra = ", udp: {mode: datagram}"
	}
	_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"}, Transport: "quic",
		Tunnels: []testutil.TunnelSpec{
			{Name: "many", Protocol: "udp", Target: many, Port: pM, Extra: ", udp: {mode: datagram}"}, loneSpec},
		Ports: map[string]int{"r1": exitPort}, Endpoints: map[string]string{"r1": link.Addr().String()}})
	var manyC []*net.UDPConn
	for range 32 {
		manyC = append(manyC, udpClient(t, pM))
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var loneUDP *net.UDPConn
	if loneProtocol == "udp" {
		loneUDP = udpClient(t, pL)
	} else {
		c := testutil.DialTunnel(t, pL)
		go func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for ctx.Err() == nil {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
	// Each UDP Tunnel offers twice the link, in 1000-byte datagrams: 5,000
	// a second, 25 every 5 ms. A tick a busy host stretches costs both
	// alike.
	go func() {
		p := make([]byte, 1000)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		next := 0
		for ctx.Err() == nil {
			<-tk.C
			for range 25 {
				manyC[next].Write(p)
				next = (next + 1) % len(manyC)
				if loneUDP != nil {
					loneUDP.Write(p)
				}
			}
		}
	}()
	// The allocator sets no caps in a link's first second, the channels
	// learn the link, a TCP flow grows into what the caps free.
	time.Sleep(3 * time.Second)
	manyGot.Store(0)
	loneGot.Store(0)
	var mb, lb float64
	for i := range 3 {
		time.Sleep(time.Second)
		ms, ls := float64(manyGot.Swap(0))*8/1e6, float64(loneGot.Swap(0))*8/1e6
		t.Logf("second %d: many %.1f Mbit/s, lone %.1f Mbit/s", i, ms, ls)
		mb, lb = mb+ms, lb+ls
	}
	stop()
	share := lb / (mb + lb)
	capped := promtest.ToFloat64(m.UDPDropped.WithLabelValues("r0", "default/many", "fair_share"))
	t.Logf("lone's share %.1f%%; many's datagrams dropped over its fair share: %.0f", 100*share, capped)
	if mb+lb == 0 {
		t.Fatal("nothing delivered")
	}
	if share < 0.4 {
		t.Errorf("lone (%s) got %.1f%% of what both Tunnels delivered beside many's 32 UDP sessions, want 40%% or more", loneProtocol, 100*share)
	}
	if loneProtocol == "tcp" && capped == 0 {
		t.Error("many was never capped at its fair share beside a TCP Tunnel short of its own")
	}
}
