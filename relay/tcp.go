package relay

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/probe"
)

// endBuffer is the kernel send and receive buffer of the sockets toward
// clients and targets. The kernel would grow them to 4 and 32 MiB, and a
// flow that stalls (a client that stops reading, data the relay cannot
// pass on) keeps what it holds: a thousand of them fill the host's TCP
// memory (tcp_mem), and then every socket on the host slows, every
// Tunnel's. Clients and targets are near their relays (the chain crosses
// the distance), where 128 KiB (the kernel doubles it) moves several Gbit/s.
const endBuffer = 128 << 10

// tcpFlows carries TCP flows in every role: the entry accepts a Tunnel's
// clients and opens the chain, a middle relay passes a flow one hop on, the
// exit dials the target. A tun Tunnel's TCP flows enter here too.
type tcpFlows struct {
	*env
	hops   *nexthop.Hops
	routes *routeBook
	// targets learns the target's round trip from every real connect.
	targets *probe.Targets
}

// listen opens a TCP Tunnel's listeners on its entry relay, one per
// address (entryListen); stop closes them (open flows go on).
func (f *tcpFlows) listen(t *v1alpha1.Tunnel, addrs []string, loopbacks bool) (stop func(), bound []string, err error) {
	lns, bound, err := listenEach(addrs, loopbacks, func(addr string) (*net.TCPListener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		return ln.(*net.TCPListener), nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, ln := range lns {
		f.spawn(func() { f.serve(ln, t) })
	}
	return func() {
		for _, ln := range lns {
			ln.Close()
		}
	}, bound, nil
}

func (f *tcpFlows) serve(ln *net.TCPListener, t *v1alpha1.Tunnel) {
	key := manifest.Key(t.Namespace, t.Name)
	allowed := allowedSources(t)
	var backoff time.Duration
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errorsIsClosed(err) {
				return
			}
			// Out of file descriptors and the like: slow down, keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			f.log.Warn("accept failed", "tunnel", key, "err", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c.SetWriteBuffer(endBuffer)
		c.SetReadBuffer(endBuffer)
		host := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		if !allowed(host) {
			f.flowError(key, sourceNotAllowed)
			c.SetLinger(0) // a reset: nothing of the Tunnel answers
			c.Close()
			continue
		}
		if !f.acquire(key, host) {
			c.SetLinger(0)
			c.Close()
			continue
		}
		f.spawn(func() {
			defer f.release(key, host)
			in, err := flow.TCP(c)
			if err != nil {
				c.Close()
				return
			}
			f.entry(in, t, key, t.Spec.Target)
		})
	}
}

// entry carries one flow into the chain toward target: a TCP Tunnel's
// client, or a TCP flow a tun Tunnel's stack terminated.
func (f *tcpFlows) entry(in flow.End, t *v1alpha1.Tunnel, key, target string) {
	start := time.Now()
	fc, done := f.beginTCP(key, "entry")
	defer done()
	ctx, cancel := f.setupContext()
	defer cancel()
	chain, route, err := f.routes.routeOf(ctx, t)
	if err != nil {
		f.hopFailed(key, err)
		in.Abort()
		return
	}
	if len(route) == 1 {
		f.forward(ctx, in, t, target, start, fc)
		return
	}
	fc, paced := f.pace(fc, t, true, false)
	h := &hop.Header{Kind: hop.KindTCP, Tunnel: key, Route: route[1:], Target: target}
	if a, ok := in.(*flow.TCPEnd); ok {
		h.Client, h.Listener = proxyAddrs(t, a.Conn().RemoteAddr(), a.Conn().LocalAddr())
	}
	next, err := f.hops.Open(ctx, h, nexthop.OpenOptions{Transport: chain.Spec.Transport})
	cancel()
	if err != nil {
		f.hopFailed(key, err)
		in.Abort()
		return
	}
	out, via := next.Stream(), next.Choice
	if paced {
		via.Unmeasured()
	}
	var release func()
	fc.up, release = f.share(fc.up, t, next.Peer)
	defer release()
	f.m.FlowSetup.WithLabelValues(f.name, key, "entry").Observe(time.Since(start).Seconds())
	f.join(key, sideClient, sideNextHop, flow.Join(in, out, via.Count(fc.up, flow.Up), via.Count(fc.down, flow.Down), tcpIdle(t)))
	via.Done()
}

// The ends of a joined flow, as the reason a reset of theirs is counted
// under.
const (
	sideClient  = "client_reset"
	sidePrevHop = "prev_hop_reset"
	sideNextHop = "next_hop_reset"
	sideTarget  = "target_reset"
)

// join counts how a joined flow ended in error: idle, stalled, or reset
// by the end that failed first (a, toward the client; b, toward the
// target), where it ended and, as the reset travels, at every relay of
// its route: a relay that dies mid-flow is a next_hop_reset before it and
// a prev_hop_reset after it.
func (f *tcpFlows) join(tunnel, a, b string, err error) {
	var broken *flow.Broken
	switch {
	case err == nil:
	case errors.Is(err, flow.ErrIdle):
		f.flowError(tunnel, "idle")
	case errors.Is(err, flow.ErrStalled):
		f.flowError(tunnel, "stalled")
		f.warn.Warn("tcp flow reset: stuck in a write for a second or more while a new flow of its QUIC connection waited for the window", "tunnel", tunnel)
	case errors.As(err, &broken) && broken.At == flow.A:
		f.flowError(tunnel, a)
	case errors.As(err, &broken):
		f.flowError(tunnel, b)
	}
}

// tcpIdle is how long a TCP flow of the Tunnel may move no byte.
func tcpIdle(t *v1alpha1.Tunnel) time.Duration {
	if c := t.Spec.TCP; c != nil && c.IdleTimeoutSeconds > 0 {
		return time.Duration(c.IdleTimeoutSeconds) * time.Second
	}
	return v1alpha1.DefaultTCPIdleTimeout * time.Second
}

// forward is a flow whose entry is its exit: a plain port forward, spliced
// in the kernel when both ends are sockets.
func (f *tcpFlows) forward(ctx context.Context, in flow.End, t *v1alpha1.Tunnel, target string, start time.Time, fc flowCounters) {
	key := manifest.Key(t.Namespace, t.Name)
	tc, err := f.dial(ctx, key, target, "entry", start)
	if err != nil {
		in.Abort()
		return
	}
	fc, paced := f.pace(fc, t, true, true)
	if a, ok := in.(*flow.TCPEnd); ok {
		client, listener := proxyAddrs(t, a.Conn().RemoteAddr(), a.Conn().LocalAddr())
		if !f.tellTarget(tc, t, client, listener) {
			in.Abort()
			return
		}
		// The kernel copies, unless a rate limit paces each copy.
		if !paced {
			f.join(key, sideClient, sideTarget, flow.Splice(a.Conn(), tc, fc.up, fc.down, tcpIdle(t)))
			return
		}
	}
	f.joinTarget(in, sideClient, tc, fc, t)
}

// tellTarget writes the PROXY header t asks for, if any, to the target's
// connection; false (the connection closed) when it cannot.
func (f *tcpFlows) tellTarget(tc *net.TCPConn, t *v1alpha1.Tunnel, client, listener string) bool {
	b := proxyHeader(t, false, client, listener)
	if b == nil {
		return true
	}
	if _, err := tc.Write(b); err != nil {
		tc.Close()
		return false
	}
	return true
}

// middle carries a flow one hop further, over the chain's transport (under
// auto, this relay's choice for its link to the next).
func (f *tcpFlows) middle(in flow.End, prev string, h *hop.Header, t *v1alpha1.Tunnel, chain *v1alpha1.Chain) {
	fc, done := f.beginTCP(h.Tunnel, "middle")
	defer done()
	if h.Kind == hop.KindUDP {
		g := f.m.UDPSessions.WithLabelValues(f.name, h.Tunnel, "middle")
		g.Inc()
		defer g.Dec()
	}
	ctx, cancel := f.setupContext()
	// A session that came here is framed on a byte stream (TLS): it goes
	// on over TLS.
	next, err := f.hops.Open(ctx, nexthop.Onward(h), nexthop.OpenOptions{Transport: chain.Spec.Transport, Came: v1alpha1.TransportTLS})
	cancel()
	if err != nil {
		f.hopFailed(h.Tunnel, err)
		in.Fail(hop.CodeNextHop)
		return
	}
	out, via := next.Stream(), next.Choice
	if rateLimited(t) {
		via.Unmeasured() // the entry or the exit holds it to its rate
	}
	up, releaseUp := f.share(fc.up, t, next.Peer)
	defer releaseUp()
	down, releaseDown := f.share(fc.down, t, prev)
	defer releaseDown()
	fc.up, fc.down = up, down
	f.join(h.Tunnel, sidePrevHop, sideNextHop, flow.Join(in, out, via.Count(fc.up, flow.Up), via.Count(fc.down, flow.Down), tcpIdle(t)))
	via.Done()
}

// exit connects a flow to its target.
func (f *tcpFlows) exit(in flow.End, prev string, h *hop.Header, t *v1alpha1.Tunnel) {
	start := time.Now()
	fc, done := f.beginTCP(h.Tunnel, "exit")
	defer done()
	ctx, cancel := f.setupContext()
	defer cancel()
	tc, err := f.dial(ctx, h.Tunnel, h.Target, "exit", start)
	if err != nil {
		in.Fail(hop.CodeDialFailed)
		return
	}
	if !f.tellTarget(tc, t, h.Client, h.Listener) {
		in.Fail(hop.CodeDialFailed)
		return
	}
	fc, _ = f.pace(fc, t, false, true)
	var release func()
	fc.down, release = f.share(fc.down, t, prev)
	defer release()
	f.joinTarget(in, sidePrevHop, tc, fc, t)
}

// joinTarget joins a flow (from the client, or the previous hop: inSide)
// to the connection to its target.
func (f *tcpFlows) joinTarget(in flow.End, inSide string, tc *net.TCPConn, fc flowCounters, t *v1alpha1.Tunnel) {
	out, err := flow.TCP(tc)
	if err != nil {
		in.Abort()
		tc.Close()
		return
	}
	f.join(manifest.Key(t.Namespace, t.Name), inSide, sideTarget, flow.Join(in, out, fc.up, fc.down, tcpIdle(t)))
}

func (f *tcpFlows) dial(ctx context.Context, tunnel, target, role string, start time.Time) (*net.TCPConn, error) {
	dialStart := time.Now()
	c, err := f.egress.Dialer().DialContext(ctx, "tcp", target)
	if err != nil {
		f.dialFailed(tunnel, target, err)
		return nil, err
	}
	c.(*net.TCPConn).SetWriteBuffer(endBuffer)
	c.(*net.TCPConn).SetReadBuffer(endBuffer)
	// A real connect is a measurement of the target too.
	spec := probe.TargetSpec{Tunnel: tunnel, Target: target}
	f.targets.Observe(spec, time.Since(dialStart))
	f.dials.record(spec, nil)
	f.m.FlowSetup.WithLabelValues(f.name, tunnel, role).Observe(time.Since(start).Seconds())
	return c.(*net.TCPConn), nil
}
