package nexthop

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
)

// Under auto a Tunnel whose flows are long-lived interactive rides TLS on
// a short clean link, each flow with its socket's buffers fixed, past the
// bulk share of TLS flows; past a share of its own it rides QUIC.
func TestLongInteractiveFlowsRideTLS(t *testing.T) {
	a, got, _ := two(t, "auto")
	go func() {
		for range got {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"b"}, Target: "127.0.0.1:1"}
	// Kept-alive clients: 20 KiB in 320 turns a flow.
	for range shortFlows {
		a.auto.done("b", shapeKey(h), v1alpha1.TransportQUIC, 20<<10, 320, time.Minute, time.Now())
	}
	var ends []func()
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	open := func(transport v1alpha1.Transport) *Hop {
		t.Helper()
		next, err := a.Open(ctx, h, OpenOptions{Transport: transport})
		if err != nil {
			t.Fatal(err)
		}
		next.Stream().Write([]byte("hello"))
		ends = append(ends, next.Stream().Abort)
		return next
	}
	// The link is known to be short once its QUIC connection measured
	// its round trip; a flow opened over QUIC brings the connection up.
	open(v1alpha1.TransportQUIC)
	link := peerLoss{a, "b"}
	for i := 0; link.RTT() <= 0; i++ {
		if i == 100 {
			t.Fatal("the link's QUIC connection measured no round trip")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(cleanFor) // the verdict of the first flow, kept
	for i := range maxTLSInteractivePerTunnel {
		next := open(v1alpha1.TransportAuto)
		if via := next.Choice; via.Transport != v1alpha1.TransportTLS || via.Reason != ReasonLongInteractive {
			qs, ql := link.QUIC()
			ts, tl := link.OpenTLS()
			t.Fatalf("flow %d of %d took %s (%s), want TLS (%s); quic %d/%d tls %d/%d rtt %v", i+1, maxTLSInteractivePerTunnel, via.Transport, via.Reason, ReasonLongInteractive, ql, qs, tl, ts, link.RTT())
		}
		if i%64 == 0 {
			// The kernel doubles what is set.
			if rcv, snd := buffers(t, next); rcv != 2*interactiveBuffer || snd != 2*interactiveBuffer {
				t.Fatalf("flow %d: socket buffers %d to receive, %d to send; want %d each", i+1, rcv, snd, 2*interactiveBuffer)
			}
		}
	}
	if via := open(v1alpha1.TransportAuto).Choice; via.Transport != v1alpha1.TransportQUIC || via.Reason != ReasonTLSShare {
		t.Fatalf("a flow past the share took %s (%s), want QUIC (%s)", via.Transport, via.Reason, ReasonTLSShare)
	}
}

// buffers reads a TLS hop's socket buffers.
func buffers(t *testing.T, next *Hop) (rcv, snd int) {
	t.Helper()
	end, ok := next.Stream().(*flow.TLSEnd)
	if !ok || end.TCP() == nil {
		t.Fatalf("a TLS hop's end is %T", next.Stream())
	}
	raw, err := end.TCP().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) {
		rcv, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if err == nil {
			snd, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return rcv, snd
}

// Interactive TLS flows are bounded per Tunnel and peer, and at the relay
// for all of them; a slot given back is taken again. The bulk share is
// counted apart.
func TestInteractiveTLSSharesAreBounded(t *testing.T) {
	var s tlsShares
	key := func(i int) tlsShare {
		return tlsShare{peer: "b", tunnel: fmt.Sprintf("t%d", i/maxTLSInteractivePerTunnel), interactive: true}
	}
	for i := range maxTLSInteractive {
		if !s.take(key(i)) {
			t.Fatalf("flow %d of %d refused", i+1, maxTLSInteractive)
		}
	}
	more := tlsShare{peer: "c", tunnel: "another", interactive: true}
	if s.take(more) {
		t.Fatalf("a flow past the relay's %d interactive TLS flows was taken", maxTLSInteractive)
	}
	if !s.take(tlsShare{peer: "c", tunnel: "another"}) {
		t.Fatal("a bulk flow was refused for the interactive ones")
	}
	s.give(key(0))
	if !s.take(more) {
		t.Fatal("a slot given back was not taken again")
	}
	// Giving back what was never taken counts nothing.
	s.give(tlsShare{peer: "x", tunnel: "none", interactive: true})
	if s.take(more) {
		t.Fatal("a slot never taken, given back, made room")
	}
}
