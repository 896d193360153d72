package nexthop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hoplink/hoplink/relay/flow"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

// received is what the far relay got: the header it read and the first
// bytes after it.
type received struct {
	peer string
	h    hop.Header
	data string
}

// reporter is an Upper that hands what a peer sent, over either transport,
// to itself.
type reporter func(peer string, r io.Reader)

func (f reporter) Serve(in Inbound) {
	f(in.Hop.Peer, io.MultiReader(bytes.NewReader(headerBytes(in.Header)), in.Hop.Stream()))
}

// headerBytes is h as it came: the link layer read it off the stream.
func headerBytes(h hop.Header) []byte {
	b, err := h.Append(nil)
	if err != nil {
		panic(err)
	}
	return b
}

func (reporter) Event(Event) {}

// two starts relays a and b; b reports what each stream or TLS connection
// carried. a's manifests route chain c (a -> b) over transport.
func two(t *testing.T, transport string) (a *Hops, got chan received, set *manifest.Set) {
	t.Helper()
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	set, err := manifest.Parse("two.yaml", fmt.Appendf(nil, `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: a, exit: b, route: [a, b], transport: %s}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, listen: {port: 15999}, target: "127.0.0.1:1"}
`, pa, pa, pb, pb, transport))
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	got = make(chan received, 4)
	report := func(peer string, r io.Reader) {
		h, err := hop.Read(r)
		if err != nil {
			got <- received{peer: peer, data: "bad header: " + err.Error()}
			return
		}
		buf := make([]byte, 5)
		n, _ := io.ReadFull(r, buf)
		got <- received{peer: peer, h: h, data: string(buf[:n])}
	}
	start := func(name string, port int, peers []Peer) *Peers {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		p := New(Options{Name: name, Identity: id, Listen: fmt.Sprintf("127.0.0.1:%d", port), Metrics: m, Log: log})
		p.SetPeers(peers)
		if err := p.Listen(reporter(report), nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	// What the relays above would read from set: both know both; a sends
	// b flows, over TLS too unless the chain takes QUIC.
	ra := Peer{Name: "a", Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", pa)}}
	rb := Peer{Name: "b", Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", pb)}}
	start("b", pb, []Peer{ra, rb})
	rb.NextHop, rb.Warm = true, transport != "quic"
	a = start("a", pa, []Peer{ra, rb}).Hops()
	return a, got, set
}

func TestOpenSendsTheHeaderWithTheFirstBytes(t *testing.T) {
	for _, transport := range []string{"quic", "tls", "auto"} {
		t.Run(transport, func(t *testing.T) {
			a, got, set := two(t, transport)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The relay above chooses routes; this one is the manifests'.
			chain := set.ChainOf(set.Tunnel("default/t"))
			route := manifest.Route(chain)
			if chain.Name != "c" || len(route) != 2 {
				t.Fatalf("route %v of %v", route, chain)
			}
			h := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: route[1:], Target: "127.0.0.1:1"}
			if transport == "auto" {
				// A flow of unknown shape takes TLS only from a warm pool.
				for i := 0; i < 100 && !hasSpare(a, "b"); i++ {
					time.Sleep(20 * time.Millisecond)
				}
			}
			next, err := a.Open(ctx, h, OpenOptions{Transport: chain.Spec.Transport})
			if err != nil {
				t.Fatal(err)
			}
			out, via := next.Stream(), next.Choice
			defer out.Abort()
			// A clean link with nothing measured yet takes TLS for bulk.
			if want := map[string]string{"quic": "quic", "tls": "tls", "auto": "tls"}[transport]; string(via.Transport) != want {
				t.Fatalf("transport %s: took %s (%s), want %s", transport, via.Transport, via.Reason, want)
			}
			out.Write([]byte("hello"))
			select {
			case r := <-got:
				if r.peer != "a" || r.h.Tunnel != "default/t" || r.h.Route[0] != "b" || r.data != "hello" {
					t.Fatalf("b received %+v", r)
				}
			case <-ctx.Done():
				t.Fatal("nothing arrived")
			}
		})
	}
}

func TestErrorsSayWhy(t *testing.T) {
	a, _, _ := two(t, "quic")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var he *Error

	_, err := a.Open(ctx, &hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"mallory"}, Target: "x:1"}, OpenOptions{Transport: v1alpha1.TransportQUIC})
	if !errors.As(err, &he) || he.Reason != NextHop || he.Next != "mallory" {
		t.Fatalf("unknown relay: %v", err)
	}
	// A peer that is not connected now is not waited for by a Live open.
	if _, err := a.Open(ctx, &hop.Header{Kind: hop.KindLinks, Tunnel: "default/c", Route: []string{"a"}}, OpenOptions{Live: true}); !errors.As(err, &he) || !errors.Is(err, rquic.ErrPeerDown) {
		t.Fatalf("a Live open to a relay without a link: %v", err)
	}
	if got := Onward(&hop.Header{Route: []string{"x", "y", "z"}}).Route; len(got) != 2 || got[0] != "y" {
		t.Fatalf("Onward: %v", got)
	}
}

func hasSpare(hs *Hops, peer string) bool {
	r, _ := hs.p.peer(peer)
	pool := hs.p.pools.Pool(peer, r.Endpoints)
	return pool.Spares() > 0
}

// Under auto a Tunnel's bulk flows take at most their share of TLS
// connections to a peer; past it they ride QUIC, a flow that ends gives its
// slot back, and another Tunnel's share is its own.
func TestATunnelsTLSFlowsAreBounded(t *testing.T) {
	a, got, _ := two(t, "auto")
	go func() {
		for range got {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tunnel := range []string{"default/t", "default/u"} {
		// Known bulk, worth a handshake; both transports measured, TLS
		// the faster, so no flow samples QUIC.
		key := shapeKey(&hop.Header{Tunnel: tunnel, Target: "127.0.0.1:1"})
		for range max(shortFlows, minSamples) {
			a.auto.done("b", key, v1alpha1.TransportTLS, 8<<20, 0, time.Second, time.Now())
			a.auto.done("b", key, v1alpha1.TransportQUIC, 8<<20, 0, 2*time.Second, time.Now())
		}
	}
	open := func(tunnel string) (*Choice, func()) {
		t.Helper()
		h := &hop.Header{Kind: hop.KindTCP, Tunnel: tunnel, Route: []string{"b"}, Target: "127.0.0.1:1"}
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		next, err := a.Open(octx, h, OpenOptions{Transport: v1alpha1.TransportAuto})
		if err != nil {
			t.Fatal(err)
		}
		next.Stream().Write([]byte("hello"))
		return next.Choice, next.Stream().Abort
	}
	var ends []func()
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	for i := range maxTLSFlowsPerTunnel {
		via, end := open("default/t")
		ends = append(ends, end)
		if via.Transport != v1alpha1.TransportTLS {
			t.Fatalf("flow %d of %d took %s (%s), want TLS", i+1, maxTLSFlowsPerTunnel, via.Transport, via.Reason)
		}
	}
	via, end := open("default/t")
	end()
	if via.Transport != v1alpha1.TransportQUIC || via.Reason != ReasonTLSShare {
		t.Fatalf("a flow past the share took %s (%s), want QUIC (%s)", via.Transport, via.Reason, ReasonTLSShare)
	}
	if via, end := open("default/u"); via.Transport != v1alpha1.TransportTLS {
		end()
		t.Fatalf("another Tunnel's flow took %s (%s), want TLS", via.Transport, via.Reason)
	} else {
		end()
	}
	ends[0]()
	ends = ends[1:]
	via, end = open("default/t")
	ends = append(ends, end)
	if via.Transport != v1alpha1.TransportTLS {
		t.Fatalf("after a TLS flow ended the next took %s (%s), want TLS", via.Transport, via.Reason)
	}
}

// TestSessionsOpenOverTLS: a packet or UDP session that came over TLS is a
// byte stream of frames, so a middle relay opens its next hop over TLS even
// where auto would take QUIC for the link. Over QUIC the next relay would
// read those bytes as a QUIC session's.
func TestSessionsOpenOverTLS(t *testing.T) {
	a, got, _ := two(t, "auto")
	// Measured: QUIC moves bulk faster on a -> b.
	for range max(shortFlows, minSamples) {
		a.auto.done("b", "default/t", v1alpha1.TransportQUIC, 8<<20, 0, time.Second, time.Now())
		a.auto.done("b", "default/t", v1alpha1.TransportTLS, 8<<20, 0, 2*time.Second, time.Now())
	}
	if tr, _, _ := a.pick("b", "default/t", false, nil); tr != v1alpha1.TransportQUIC {
		t.Fatalf("setup: the link's bulk transport is %s, want QUIC", tr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, kind := range []hop.Kind{hop.KindPacket, hop.KindUDP} {
		h := &hop.Header{Kind: kind, Tunnel: "default/t", Route: []string{"b"}}
		if kind == hop.KindUDP {
			h.Target = "127.0.0.1:1"
		}
		next, err := a.Open(ctx, h, OpenOptions{Transport: v1alpha1.TransportAuto, Came: v1alpha1.TransportTLS})
		if err != nil {
			t.Fatal(err)
		}
		next.Stream().Write([]byte("hello"))
		r := <-got
		next.Stream().Abort()
		if next.Transport != v1alpha1.TransportTLS {
			t.Errorf("%s session opened over %s, want TLS", kind, next.Transport)
		}
		if r.h.Kind != kind || r.data != "hello" {
			t.Errorf("b got %+v", r)
		}
	}
}

// TestUDPSessionsTakeTheBulkTransport: under auto a UDP session rides QUIC
// datagrams until its Tunnel is bulk (udp.mode stream, or a session sent
// at a bulk rate), then the link's bulk transport, within the Tunnel's
// share of TLS connections; explicit chains and datagram mode keep QUIC.
// A lossy link does not send a bulk session to QUIC, as it does a packet
// session: framed, the session rides a reliable stream either way.
func TestUDPSessionsTakeTheBulkTransport(t *testing.T) {
	a, got, _ := two(t, "auto")
	go func() {
		for range got {
		}
	}()
	a.auto.tcpLoss("b", 1000, 100)
	if tr, reason, _ := a.pick("b", "default/t", false, nil); tr != v1alpha1.TransportQUIC || reason != ReasonLossy {
		t.Fatalf("setup: a packet session takes %s (%s), want QUIC (%s)", tr, reason, ReasonLossy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ends []func()
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	open := func(tunnel string, transport v1alpha1.Transport, mode v1alpha1.UDPMode) v1alpha1.Transport {
		t.Helper()
		h := &hop.Header{Kind: hop.KindUDP, Tunnel: tunnel, Route: []string{"b"}, Target: "127.0.0.1:1"}
		next, err := a.Open(ctx, h, OpenOptions{Transport: transport, UDPMode: mode})
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, next.Stream().Abort)
		return next.Transport
	}
	for _, c := range []struct {
		name      string
		tunnel    string
		transport v1alpha1.Transport
		mode      v1alpha1.UDPMode
		want      v1alpha1.Transport
	}{
		{"auto, not known bulk", "default/t", v1alpha1.TransportAuto, v1alpha1.UDPAuto, v1alpha1.TransportQUIC},
		{"auto, mode stream", "default/t", v1alpha1.TransportAuto, v1alpha1.UDPStream, v1alpha1.TransportTLS},
		{"auto, mode datagram", "default/t", v1alpha1.TransportAuto, v1alpha1.UDPDatagram, v1alpha1.TransportQUIC},
		{"quic, mode stream", "default/t", v1alpha1.TransportQUIC, v1alpha1.UDPStream, v1alpha1.TransportQUIC},
		{"tls, mode stream (UDP keeps QUIC)", "default/t", v1alpha1.TransportTLS, v1alpha1.UDPStream, v1alpha1.TransportQUIC},
	} {
		if got := open(c.tunnel, c.transport, c.mode); got != c.want {
			t.Errorf("%s: took %s, want %s", c.name, got, c.want)
		}
	}
	a.UDPBulk("default/u")
	if got := open("default/u", v1alpha1.TransportAuto, v1alpha1.UDPAuto); got != v1alpha1.TransportTLS {
		t.Errorf("a session of a Tunnel seen bulk took %s, want TLS", got)
	}
	// default/u holds one TLS session now; its share bounds the rest.
	for i := 1; i < maxTLSFlowsPerTunnel; i++ {
		if got := open("default/u", v1alpha1.TransportAuto, v1alpha1.UDPAuto); got != v1alpha1.TransportTLS {
			t.Fatalf("session %d of the share took %s, want TLS", i+1, got)
		}
	}
	if got := open("default/u", v1alpha1.TransportAuto, v1alpha1.UDPAuto); got != v1alpha1.TransportQUIC {
		t.Errorf("a session past the Tunnel's TLS share took %s, want QUIC", got)
	}
}

// openTLSFlow opens a flow from a to b over TLS; ctx bounds the test.
func openTLSFlow(t *testing.T) (a *Hops, got chan received, ctx context.Context, next *Hop) {
	t.Helper()
	a, got, set := two(t, "tls")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	h := &hop.Header{Kind: hop.KindTCP, Tunnel: "default/t", Route: []string{"b"}, Target: "127.0.0.1:1"}
	next, err := a.Open(ctx, h, OpenOptions{Transport: set.Chain("default/c").Spec.Transport})
	if err != nil {
		t.Fatal(err)
	}
	return a, got, ctx, next
}

// An open TLS flow that an event loop carries (its socket taken from Go's
// poller) still shows what it sent, until it ends.
func TestOpenTLSFlowsOnALoopShowWhatTheySent(t *testing.T) {
	a, got, ctx, next := openTLSFlow(t)
	client, in := testutil.TCPPair(t)
	end, err := flow.TCP(in)
	if err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	up, down := prometheus.NewCounter(prometheus.CounterOpts{Name: "up"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "down"})
	go func() { joined <- flow.Join(end, next.Stream(), up, down, 0) }()
	client.Write([]byte("hello"))
	select {
	case r := <-got:
		if r.data != "hello" {
			t.Fatalf("b read %q", r.data)
		}
	case <-ctx.Done():
		t.Fatal("nothing arrived")
	}
	// On a loop, Go's descriptor of the connection is closed.
	if _, err := next.Stream().(*flow.TLSEnd).TCP().File(); err == nil {
		t.Fatal("the flow is not on a loop: its TCP connection is still Go's")
	}
	if sent, _ := a.live.counts("b"); sent == 0 {
		t.Fatal("an open TLS flow on a loop shows no segments sent")
	}
	client.SetLinger(0)
	client.Close()
	select {
	case <-joined:
	case <-ctx.Done():
		t.Fatal("the flow did not end after its client reset")
	}
	if n := len(a.live.conns["b"]); n != 0 {
		t.Fatalf("a TLS flow that ended is still watched (%d)", n)
	}
}

// The TCP connections of TLS flows open to a peer show the link's loss
// before the flows end; a flow that ended is no longer read.
func TestOpenTLSFlowsShowWhatTheySent(t *testing.T) {
	a, got, ctx, next := openTLSFlow(t)
	out := next.Stream()
	out.Write([]byte("hello"))
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("nothing arrived")
	}
	if sent, _ := a.live.counts("b"); sent == 0 {
		t.Fatal("an open TLS flow to b shows no segments sent")
	}
	if sent, _ := a.live.counts("c"); sent != 0 {
		t.Fatalf("another peer shows %d segments", sent)
	}
	out.Abort()
	if n := len(a.live.conns["b"]); n != 0 {
		t.Fatalf("a TLS flow that ended is still watched (%d)", n)
	}
}
