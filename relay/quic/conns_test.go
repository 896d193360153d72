package quic

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// boundedEndpoint is an endpoint whose peers may each hold limit
// connections to it.
func boundedEndpoint(t *testing.T, ca *pki.CA, name string, limit int, handler func(*Conn, *quicgo.Stream)) *Endpoint {
	t.Helper()
	id, err := ca.Identity(name)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Listen(Options{Name: name, Identity: id, Listen: "127.0.0.1:0",
		Peers:   map[string]int{"a": limit, "b": limit, "c": limit, "d": limit},
		Upper:   &testUpper{serve: handler},
		Metrics: metrics.New(prometheus.NewRegistry()),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// connsOf counts the live connections peer dialed to e.
func connsOf(e *Endpoint, peer string) int {
	n := 0
	for _, c := range e.accepted.list() {
		if c.Peer == peer && c.Context().Err() == nil {
			n++
		}
	}
	return n
}

// heapInUse is the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var st runtime.MemStats
	runtime.ReadMemStats(&st)
	return st.HeapInuse
}

// An authenticated peer that opens connection after connection, each
// filling its flow-control window with data the relay does not read (a
// stalled target), holds at most its bound of them: the rest close, and
// what the relay buffers stays within the bound's windows.
func TestConnectionsPerPeerAreBounded(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	const limit, conns, streams = 3, 16, 64
	b := boundedEndpoint(t, ca, "b", limit, func(c *Conn, s *quicgo.Stream) {
		<-c.Context().Done() // a target that never reads
	})
	before := heapInUse()
	aID, _ := ca.Identity("a")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	chunk := make([]byte, initialStreamWindow)
	var held []*quicgo.Conn
	defer func() {
		for _, c := range held {
			c.CloseWithError(0, "")
		}
	}()
	for range conns {
		c, err := quicgo.DialAddr(ctx, b.Addr().String(), aID.ClientConfig("b"), &quicgo.Config{EnableDatagrams: true})
		if err != nil {
			continue // closed during the handshake: counted below
		}
		held = append(held, c)
		// 16 MiB of a connection's window, a stream's window at a time.
		for range streams {
			s, err := c.OpenStream()
			if err != nil {
				break
			}
			s.SetWriteDeadline(time.Now().Add(3 * time.Second))
			if _, err := s.Write(chunk); err != nil {
				break
			}
		}
	}
	buffered := int64(heapInUse()) - int64(before)
	if n := connsOf(b, "a"); n > limit {
		t.Errorf("a holds %d connections to b, bound %d", n, limit)
	}
	if v := promtest.ToFloat64(b.opts.Metrics.ConnsEvicted.WithLabelValues("b", "a")); v < conns-limit {
		t.Errorf("%v connections closed for the bound, want %d", v, conns-limit)
	}
	// Each connection fills 16 MiB, which costs about 24 in packet
	// buffers: near 400 MiB for all of them, 75 for the bound's.
	t.Logf("heap in use grew by %.1f MiB", float64(buffered)/(1<<20))
	if max := int64(2*limit*streams*initialStreamWindow + 8<<20); buffered > max {
		t.Errorf("heap in use grew by %d MiB, want under %d", buffered>>20, max>>20)
	}
}

// Normal traffic over several Tunnels, each on its link, with the peer's
// bound at exactly its control link and Tunnel links: nothing closes. A
// flood of extra connections under the peer's name then closes, and the
// busy links, and the idle control link the peer probes, stay up and
// carry their flows to the end.
func TestBusyLinksOutlastAFlood(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	const tunnels = 3
	b := boundedEndpoint(t, ca, "b", 1+tunnels, func(c *Conn, s *quicgo.Stream) {
		c.Admitted()
		io.Copy(s, s)
		s.Close()
	})
	a := testEndpoint(t, ca, "a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addrs := []string{b.Addr().String()}
	control, err := a.Links().Link("b", Control, addrs).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The prober's rounds on the control link.
	probing, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	go func() {
		for probing.Err() == nil {
			control.SendProbe([]byte("12345678"))
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// Each Tunnel's flow sends 4 MiB, paced, and reads its echo; the
	// second half goes once the flood is over, so it floods busy links.
	const size = 4 << 20
	flooded := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, tunnels)
	started := make(chan struct{}, tunnels)
	for i := range tunnels {
		_, s, err := a.Links().Link("b", fmt.Sprintf("default/t%d", i), addrs).OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := bytes.Repeat([]byte{byte('a' + i)}, size)
			go func() {
				for off := 0; off < size; off += 64 << 10 {
					if _, err := s.Write(want[off : off+64<<10]); err != nil {
						return
					}
					if off == size/2 {
						started <- struct{}{}
						<-flooded
					}
					time.Sleep(5 * time.Millisecond)
				}
				s.Close()
			}()
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, want) {
				errs <- fmt.Errorf("tunnel %d: %d of %d bytes back, %v", i, len(got), size, err)
			}
		}()
	}
	for range tunnels {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the Tunnels' flows did not get going")
		}
	}
	evicted := func() float64 { return promtest.ToFloat64(b.opts.Metrics.ConnsEvicted.WithLabelValues("b", "a")) }
	if n := connsOf(b, "a"); n != 1+tunnels || evicted() != 0 {
		t.Fatalf("normal traffic: a holds %d connections to b (want %d), %v closed", n, 1+tunnels, evicted())
	}

	aID, _ := ca.Identity("a")
	const flood = 12
	for range flood {
		c, err := quicgo.DialAddr(ctx, b.Addr().String(), aID.ClientConfig("b"), &quicgo.Config{EnableDatagrams: true})
		if err != nil {
			continue
		}
		defer c.CloseWithError(0, "")
	}
	deadline := time.Now().Add(10 * time.Second)
	for evicted() < flood {
		if time.Now().After(deadline) {
			close(flooded)
			t.Fatalf("%v of %d extra connections closed", evicted(), flood)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(flooded)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if control.Context().Err() != nil {
		t.Error("the flood closed the peer's control link")
	}
	if n := connsOf(b, "a"); n > 1+tunnels {
		t.Errorf("after the flood a holds %d connections to b", n)
	}
}

// A relay dials at most MaxTunnelLinks Tunnel links to one peer: the
// peer's bound leaves room for them, and further Tunnels share them.
func TestTunnelLinksPerPeerAreBounded(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	b := testEndpointWith(t, ca, "b", func(c *Conn, s *quicgo.Stream) { <-c.Context().Done() })
	a := testEndpoint(t, ca, "a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	links := map[*Link]bool{}
	for i := range MaxTunnelLinks + 5 {
		l := a.Links().Link("b", fmt.Sprintf("default/t%d", i), []string{b.Addr().String()})
		links[l] = true
		_, s, err := l.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte{0})
	}
	if len(links) != MaxTunnelLinks {
		t.Errorf("%d Tunnels took %d links, want %d", MaxTunnelLinks+5, len(links), MaxTunnelLinks)
	}
	if n := connsOf(b, "a"); n > MaxTunnelLinks {
		t.Errorf("a holds %d connections to b", n)
	}
}
