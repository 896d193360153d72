package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/routectl"
)

// TestLinkRequestsAreBoundedAtEveryHop: the entry r0 and the via relay
// r3, turned hostile, ask r1 to pass link requests on to r2 and never
// finish them (no FIN). r1 serves r0's share (4 here), then the relay's
// bound (6) with r3's, refuses the rest at once and counts them, and
// resets the requests it holds once their deadline passes; then it serves
// again. Without the share and the deadline every request was passed on
// and its goroutines stayed for good.
func TestLinkRequestsAreBoundedAtEveryHop(t *testing.T) {
	d, total, per := linksTimeout, maxLinkRequests, maxLinkRequestsPerPeer
	// After the relays closed: cleanups run last first.
	t.Cleanup(func() { linksTimeout, maxLinkRequests, maxLinkRequestsPerPeer = d, total, per })
	linksTimeout, maxLinkRequests, maxLinkRequestsPerPeer = time.Second, 6, 4
	n := startNetwork(t, []string{"r0", "r1", "r2", "r3"},
		"---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: r0, exit: r2, via: [r1, r3], mode: sum}\n")
	n.linked(t, "r1", "r2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r1 := n.relays["r1"]
	dial := func(as string) *quicgo.Conn {
		id, _ := n.ca.Identity(as)
		c, err := quicgo.DialAddr(ctx, r1.Addr().String(), id.ClientConfig("r1"), &quicgo.Config{EnableDatagrams: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseWithError(0, "") })
		return c
	}
	// ask sends a request for r2's table through r1, its body and no FIN.
	ask := func(c *quicgo.Conn) *quicgo.Stream {
		s, err := c.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := (&hop.Header{Kind: hop.KindLinks, Tunnel: "default/c", Route: []string{"r1", "r2"}}).Append(nil)
		s.Write(h)
		if err := writeFramed(s, maxLinksBody, linksBody{}); err != nil {
			t.Fatal(err)
		}
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		return s
	}
	answered := func(s *quicgo.Stream) {
		t.Helper()
		var tb measure.Table
		if err := readFramed(s, measure.MaxTableSize, &tb); err != nil || tb.Relay != "r2" {
			t.Fatalf("a request within the share: table of %q, %v", tb.Relay, err)
		}
	}
	refused := func(s *quicgo.Stream, limited float64) {
		t.Helper()
		var tb measure.Table
		err := readFramed(s, measure.MaxTableSize, &tb)
		var se *quicgo.StreamError
		if !errors.As(err, &se) || hop.Code(se.ErrorCode) != hop.CodeRejected {
			t.Fatalf("a request past the share: %v, want a reset with code %d", err, hop.CodeRejected)
		}
		if v := promtest.ToFloat64(n.m.Rejected.WithLabelValues("r1", "links_limit")); v != limited {
			t.Fatalf("links_limit %v, want %v", v, limited)
		}
	}
	c0, c3 := dial("r0"), dial("r3")
	var held []*quicgo.Stream
	for range 4 {
		s := ask(c0)
		answered(s)
		held = append(held, s)
	}
	refused(ask(c0), 1) // r0's share
	for range 2 {
		s := ask(c3)
		answered(s)
		held = append(held, s)
	}
	refused(ask(c3), 2) // the relay's bound
	if u := r1.measure.requests.inUse(); u != 6 {
		t.Fatalf("%d requests in progress, want 6", u)
	}

	// The deadline ends the held requests at r1: their askers are told to
	// stop sending, and r1 holds nothing.
	start := time.Now()
	for i, s := range held {
		for {
			_, err := s.Write([]byte{0})
			var se *quicgo.StreamError
			if errors.As(err, &se) {
				break
			}
			if time.Since(start) > 5*linksTimeout {
				t.Fatalf("held request %d not ended %v after its deadline (%v)", i, time.Since(start), err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The asker may hear of the reset a moment before r1 lets the slot go.
	for r1.measure.requests.inUse() != 0 && time.Since(start) < 5*linksTimeout {
		time.Sleep(10 * time.Millisecond)
	}
	if u := r1.measure.requests.inUse(); u != 0 {
		t.Fatalf("%d requests still in progress past the deadline", u)
	}
	// An honest request is served again.
	s := ask(c0)
	s.Close()
	answered(s)
}

// hangingTarget is a TCP address whose connects hang: its listener's
// accept queue is full and never drained, so the kernel drops every SYN.
func hangingTarget(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 10 {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatal("connects to a listener that accepts nothing kept succeeding")
	return ""
}

// The relay's own table waits for its probes as long as a peer's would
// (routectl.ProbeWait, 350 ms at a 1 s interval), however long the route
// controller would wait for it: a round's request may outlive the round.
func TestOwnTableWaitsAsLongAsAPeers(t *testing.T) {
	target := hangingTarget(t)
	n := startNetwork(t, []string{"r0", "r1"}, fmt.Sprintf(
		"---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: r0, exit: r1, mode: sum, probe: {interval: 1s}}\n"+
			"---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t}\nspec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %d}, target: %q}\n",
		testutil.FreePort(t), target))
	r1 := n.relays["r1"]
	c := r1.set.Load().Chain("default/c")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	tb, err := r1.measure.Links(ctx, routectl.LinksRequest{Chain: c, Relay: "r1"})
	if took := time.Since(start); err != nil || took > 10*time.Second || len(tb.Targets) != 1 || tb.Targets[0].Up {
		t.Fatalf("own table after %v: %+v, %v; want the target down within the probe wait", took, tb, err)
	}
}
