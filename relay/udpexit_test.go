package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay/hop"
)

// TestUDPExitHoldsATunnelToItsMaxSessions: the entry r0, turned hostile,
// opens sessions of a Tunnel of maxSessions 4 straight to its exit r1, over
// QUIC and over TLS. r1 carries 4; the next wait for a place, are refused
// (reset) and counted as session_limit; one that waits while a session
// ends takes its place. Without the bound the exit carried every session
// opened (4,353 against 4,096).
func TestUDPExitHoldsATunnelToItsMaxSessions(t *testing.T) {
	target := udpEchoServer(t)
	n := startNetwork(t, []string{"r0", "r1"}, fmt.Sprintf(
		"---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: r0, exit: r1, route: [r0, r1]}\n"+
			"---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: u}\nspec: {chain: c, protocol: udp, listen: {address: 127.0.0.1, port: %d}, target: %q, udp: {maxSessions: 4, mode: stream}}\n",
		testutil.FreePort(t), target))
	r1 := n.relays["r1"]
	id, _ := n.ca.Identity("r0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := quicgo.DialAddr(ctx, r1.Addr().String(), id.ClientConfig("r1"), &quicgo.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.CloseWithError(0, "")
	header, _ := (&hop.Header{Kind: hop.KindUDP, Tunnel: "default/u", Route: []string{"r1"}, Target: target}).Append(nil)
	// open starts a session over QUIC or TLS and sends one packet.
	open := func(overTLS bool, msg string) io.ReadWriter {
		var rw io.ReadWriter
		if overTLS {
			c, err := tls.Dial("tcp", r1.Addr().String(), id.ClientConfig("r1"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			rw = c
		} else {
			s, err := q.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			rw = s
		}
		rw.Write(hop.AppendFrame(header, []byte(msg)))
		return rw
	}
	echoed := func(rw io.ReadWriter, msg string) error {
		p, err := hop.ReadFrame(rw, make([]byte, hop.MaxFrame))
		if err == nil && string(p) != msg {
			err = fmt.Errorf("echo %q, want %q", p, msg)
		}
		return err
	}
	limited := func() float64 {
		return promtest.ToFloat64(n.m.UDPDropped.WithLabelValues("r1", "default/u", "session_limit"))
	}
	var held []*quicgo.Stream
	for i := range 4 {
		s := open(false, fmt.Sprint("held ", i))
		if err := echoed(s, fmt.Sprint("held ", i)); err != nil {
			t.Fatalf("session %d within maxSessions: %v", i, err)
		}
		held = append(held, s.(*quicgo.Stream))
	}
	start := time.Now()
	err = echoed(open(false, "fifth"), "fifth")
	var se *quicgo.StreamError
	if !errors.As(err, &se) || hop.Code(se.ErrorCode) != hop.CodeRejected {
		t.Fatalf("a fifth session over QUIC: %v, want a reset with code %d", err, hop.CodeRejected)
	}
	if waited := time.Since(start); waited < sessionWait/2 {
		t.Fatalf("the fifth session was refused after %v, without waiting for a place", waited)
	}
	if err := echoed(open(true, "sixth"), "sixth"); err == nil {
		t.Fatal("a sixth session over TLS was carried")
	}
	if v := limited(); v != 2 {
		t.Fatalf("session_limit %v, want 2", v)
	}
	if v := promtest.ToFloat64(n.m.UDPSessions.WithLabelValues("r1", "default/u", "exit")); v != 4 {
		t.Fatalf("%v sessions at the exit, want 4", v)
	}
	gauge := func(want float64, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for promtest.ToFloat64(n.m.UDPSessions.WithLabelValues("r1", "default/u", "exit")) != want {
			if time.Since(start) > within {
				t.Fatalf("sessions at the exit not %v within %v", want, within)
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(start)
	}
	end := func(s *quicgo.Stream) {
		s.CancelRead(quicgo.StreamErrorCode(hop.CodeReset))
		s.CancelWrite(quicgo.StreamErrorCode(hop.CodeReset))
	}
	// A session's end frees its place at once, not at the exit's next
	// look at its target socket (each second).
	end(held[3])
	gauge(3, 5*time.Second)
	fresh := open(false, "fresh")
	if err := echoed(fresh, "fresh"); err != nil {
		t.Fatal(err)
	}
	end(fresh.(*quicgo.Stream))
	if took := gauge(3, 5*time.Second); took > sessionWait/4 {
		t.Fatalf("an ended session held its place at the exit %v", took)
	}
	// A session that waits while another ends takes its place.
	if err := echoed(open(false, "fourth"), "fourth"); err != nil {
		t.Fatal(err)
	}
	next := open(true, "next")
	time.Sleep(sessionWait / 4)
	end(held[0])
	if err := echoed(next, "next"); err != nil {
		t.Fatalf("a session waiting while another ended: %v", err)
	}
	if v := limited(); v != 2 {
		t.Fatalf("session_limit %v after a place was freed, want 2", v)
	}
}

// udpEchoServer is a UDP target that answers every packet with itself.
func udpEchoServer(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return pc.LocalAddr().String()
}
