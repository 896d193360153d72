package tlslink

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"

	"github.com/hoplink/hoplink/relay/flow"
)

// loopHop is client <-> [relay: TCP end | TLS end] <-> peer, as an entry
// relay joins its client to the TLS connection toward the next relay; the
// relay's TLS connection is a link's (wrap), which an event loop takes
// over. peerRaw is the TCP connection under the peer's TLS.
type loopHop struct {
	client  *net.TCPConn
	peer    *tls.Conn
	peerRaw *net.TCPConn
	rc      *recordConn // the relay's, under its TLS end
	done    chan error
	closed  atomic.Bool // the TLS end's done ran
	end     *flow.TLSEnd
}

type byteCount struct{ n atomic.Int64 }

func (c *byteCount) Add(v float64) { c.n.Add(int64(v)) }

func newLoopHop(t *testing.T) *loopHop { return newLoopHopWith(t, nil) }

// newLoopHopWith is newLoopHop with before run just before the flow is
// joined.
func newLoopHopWith(t *testing.T, before func(*loopHop)) *loopHop {
	t.Helper()
	a, b := twoIdentities(t)
	h := &loopHop{done: make(chan error, 1)}
	var in *net.TCPConn
	h.client, in = testutil.TCPPair(t)
	var out *net.TCPConn
	out, h.peerRaw = testutil.TCPPair(t)
	h.rc = wrap(out).(*recordConn)
	relaySide := tls.Client(h.rc, a.ClientConfig("b"))
	h.peer = tls.Server(h.peerRaw, b.ServerConfig(nil))
	errs := make(chan error, 1)
	go func() { errs <- h.peer.Handshake() }()
	if err := relaySide.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	tcpEnd, err := flow.TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	h.end = flow.TLS(relaySide, func() { h.closed.Store(true) })
	if before != nil {
		before(h)
	}
	go func() { h.done <- flow.Join(tcpEnd, h.end, &byteCount{}, &byteCount{}, 0) }()
	deadline := time.Now().Add(10 * time.Second)
	h.client.SetDeadline(deadline)
	h.peer.SetDeadline(deadline)
	return h
}

func (h *loopHop) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the flow did not end")
		return nil
	}
}

// TestJoinOverTLSOnALoop: a flow between a TCP socket and a link's TLS
// connection is carried by an event loop (the connection is taken over):
// every byte both ways, in small messages and in bulk, and each direction
// ends cleanly when its sender ends it, a close_notify toward the peer.
func TestJoinOverTLSOnALoop(t *testing.T) {
	h := newLoopHop(t)
	// A few request/response turns.
	buf := make([]byte, 64)
	for i := range 50 {
		msg := bytes.Repeat([]byte{byte(i)}, 64)
		if _, err := h.client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(h.peer, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("turn %d: peer read %v, %v", i, buf, err)
		}
		if _, err := h.peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(h.client, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("turn %d: client read %v, %v", i, buf, err)
		}
	}
	if h.rc.lo.Load() == nil {
		t.Fatal("the link's connection was not taken over by an event loop")
	}
	// Bulk both ways at once, each then half-closed by its sender.
	up, down := make([]byte, 3<<20), make([]byte, 2<<20+17)
	for i := range up {
		up[i] = byte(rand.IntN(256))
	}
	for i := range down {
		down[i] = byte(rand.IntN(256))
	}
	go func() {
		h.client.Write(up)
		h.client.CloseWrite()
	}()
	go func() {
		h.peer.Write(down)
		h.peer.CloseWrite()
	}()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(h.peer); got <- b }()
	gotDown, err := io.ReadAll(h.client)
	if err != nil || !bytes.Equal(gotDown, down) {
		t.Fatalf("client read %d of %d bytes, then %v", len(gotDown), len(down), err)
	}
	if gotUp := <-got; !bytes.Equal(gotUp, up) {
		t.Fatalf("peer read %d of %d bytes", len(gotUp), len(up))
	}
	if err := h.result(t); err != nil {
		t.Fatalf("a flow both senders ended reported %v", err)
	}
	if !h.closed.Load() {
		t.Error("the TLS end's endpoint was not told the connection finished")
	}
	if sent, _ := h.end.Segments(); sent == 0 {
		t.Error("no TCP_INFO read from the taken-over socket")
	}
}

// TestLoopFlowCutAtThePeer: the peer's TCP connection ends without a
// close_notify (its relay was killed): the client must see a reset, never
// a clean end, and the flow reports the cut.
func TestLoopFlowCutAtThePeer(t *testing.T) {
	h := newLoopHop(t)
	h.peer.Write([]byte("part of an answer"))
	got := make([]byte, 17)
	if _, err := io.ReadFull(h.client, got); err != nil {
		t.Fatal(err)
	}
	h.peerRaw.Close()
	if _, err := io.ReadAll(h.client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client read %v after the cut, want a reset", err)
	}
	err := h.result(t)
	var broken *flow.Broken
	if !errors.As(err, &broken) || broken.At != flow.B || !errors.Is(err, flow.ErrCut) {
		t.Fatalf("the flow ended with %v, want a cut at the peer's side", err)
	}
}

// TestLoopFlowClosedByItsRelay: a relay that closes its link connections
// (it stops) resets the flows on them, which the loop carries by then.
func TestLoopFlowClosedByItsRelay(t *testing.T) {
	h := newLoopHop(t)
	h.client.Write([]byte("hello"))
	got := make([]byte, 5)
	if _, err := io.ReadFull(h.peer, got); err != nil {
		t.Fatal(err)
	}
	h.rc.Close() // what Endpoint.Close does to its active connections
	if _, err := io.ReadAll(h.client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client read %v, want a reset", err)
	}
	if _, err := io.ReadAll(h.peer); err == nil {
		t.Fatal("the peer saw a clean end")
	}
	if err := h.result(t); err == nil {
		t.Fatal("a flow its relay closed reported a clean end")
	}
}

// TestLoopFlowOverAClosedLink: a flow whose link connection closed before
// the loop could take it (its relay stopping) resets its client, and the
// link's endpoint is told the connection finished.
func TestLoopFlowOverAClosedLink(t *testing.T) {
	h := newLoopHopWith(t, func(h *loopHop) { h.rc.Close() })
	if _, err := io.ReadAll(h.client); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client read %v, want a reset", err)
	}
	if err := h.result(t); err == nil {
		t.Fatal("a flow over a closed link reported a clean end")
	}
	if !h.closed.Load() {
		t.Error("the TLS end's endpoint was not told the connection finished")
	}
}
