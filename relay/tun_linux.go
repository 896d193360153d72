//go:build linux

package relay

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/netstack"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/tun"
)

// tunFlows is a flow-mode tun Tunnel's entry: the device, and a userspace
// TCP/IP stack on it whose flows ride the chain as a TCP or UDP Tunnel's
// do, each toward its own destination. Their exits are tcpFlows' and
// udpFlows', which check the destination against the Tunnel's routes.
type tunFlows struct {
	*env
	tcp       *tcpFlows
	udp       *udpFlows
	noOffload bool
}

// openDevice opens a tun Tunnel's device at address, routing routes into
// it, and counts it in the relay's metrics.
func openDevice(e *env, t *v1alpha1.Tunnel, key string, address netip.Prefix, routes []netip.Prefix, noOffload bool) (*tun.Device, error) {
	u := t.Spec.TUN
	// The device's own prefix is a route too (the kernel adds it).
	if err := e.egress.CheckRoutes(append([]netip.Prefix{address.Masked()}, routes...)); err != nil {
		e.problems.add(adminapi.ProblemEgress, key, err.Error())
		return nil, err
	}
	return tun.Open(tun.Config{Name: u.Name, Address: address, MTU: int(u.MTU), Routes: routes,
		Offload: !noOffload, Stats: tunStats(e, key)})
}

// tunStats counts a tun Tunnel's packets in the relay's metrics.
func tunStats(e *env, key string) *tun.Stats {
	m, name := e.m, e.name
	pin, pout := m.TUNPackets.WithLabelValues(name, key, "in"), m.TUNPackets.WithLabelValues(name, key, "out")
	bin, bout := m.TUNBytes.WithLabelValues(name, key, "in"), m.TUNBytes.WithLabelValues(name, key, "out")
	return &tun.Stats{
		In:   func(p, n int) { pin.Add(float64(p)); bin.Add(float64(n)) },
		Out:  func(p, n int) { pout.Add(float64(p)); bout.Add(float64(n)) },
		Drop: func(reason string) { m.TUNDropped.WithLabelValues(name, key, reason).Inc() },
		Flow: func(proto string) { m.TUNFlows.WithLabelValues(name, key, proto).Inc() },
	}
}

// open opens a flow-mode tun Tunnel on its entry relay. stop removes the
// device and its routes, then the stack.
func (f *tunFlows) open(t *v1alpha1.Tunnel, key string, addr netip.Prefix, routes []netip.Prefix) (stop func(), err error) {
	u := t.Spec.TUN
	dev, err := openDevice(f.env, t, key, addr, routes, f.noOffload)
	if err != nil {
		return nil, err
	}
	var sessions atomic.Int64
	echoes := f.newEchoTable(dev, t, key)
	st, err := netstack.New(netstack.Options{
		Echo:   echoes.request,
		Device: dev, MTU: int(u.MTU),
		Allowed: func(a netip.Addr) bool { return manifest.PrefixesHold(u.Routes, a) },
		TCP:     func(c *netstack.TCPConn, dst netip.AddrPort) { f.entryTCP(c, dst, t, key) },
		UDP: func(c net.Conn, src, dst netip.AddrPort) {
			defer c.Close()
			if sessions.Add(1) > v1alpha1.DefaultUDPMaxSessions {
				sessions.Add(-1)
				dev.Stats.Dropped("session_limit")
				return
			}
			defer sessions.Add(-1)
			f.entryUDP(c, dst, t, key)
		},
	})
	if err != nil {
		dev.Close()
		echoes.close()
		return nil, err
	}
	f.log.Info("tun device up", "tunnel", key, "device", dev.Name, "offload", dev.Offload)
	return func() {
		dev.Close() // first: it ends the stack's reads
		st.Close()
		echoes.close()
	}, nil
}

// entryTCP carries a TCP flow of the stack to its destination.
func (f *tunFlows) entryTCP(c *netstack.TCPConn, dst netip.AddrPort, t *v1alpha1.Tunnel, key string) {
	if !f.acquire(key, netip.Addr{}) {
		c.Abort()
		return
	}
	defer f.release(key, netip.Addr{})
	f.tcp.entry(&stackEnd{c: c}, t, key, dst.String())
}

// stackEnd is a TCP flow terminated in a tun Tunnel's stack.
type stackEnd struct{ c *netstack.TCPConn }

func (e *stackEnd) Read(b []byte) (int, error)  { return e.c.Read(b) }
func (e *stackEnd) Write(b []byte) (int, error) { return e.c.Write(b) }
func (e *stackEnd) Wait() error                 { return nil }
func (e *stackEnd) CloseWrite() error           { return e.c.CloseWrite() }
func (e *stackEnd) Abort()                      { e.c.Abort() }
func (e *stackEnd) Fail(hop.Code)               { e.c.Abort() }
func (e *stackEnd) Close()                      { e.c.Close() }
func (e *stackEnd) Broken() bool                { return e.c.Broken() }

// entryUDP carries a UDP flow of the stack (one source and destination
// pair) to its destination as a UDP session.
func (f *tunFlows) entryUDP(c net.Conn, dst netip.AddrPort, t *v1alpha1.Tunnel, key string) {
	if !f.acquire(key, netip.Addr{}) {
		return
	}
	defer f.release(key, netip.Addr{})
	fc, done := f.begin(key, "entry")
	defer done()
	gauge := f.m.UDPSessions.WithLabelValues(f.name, key, "entry")
	gauge.Inc()
	defer gauge.Dec()
	ctx, cancel := f.setupContext()
	defer cancel()
	_, route, err := f.udp.routes.routeOf(ctx, t)
	if err != nil {
		f.hopFailed(key, err)
		return
	}
	var send func([]byte) error
	if len(route) == 1 {
		// The entry is the exit.
		if err := f.egress.Check(dst.Addr()); err != nil {
			f.dialFailed(key, dst.String(), err)
			return
		}
		tc, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			f.flowError(key, "dial_target")
			return
		}
		defer tc.Close()
		send = func(p []byte) error { _, err := tc.Write(p); return err }
		go copyPackets(tc, c, fc.down)
	} else {
		next, err := f.udp.hops.Open(ctx, &hop.Header{Kind: hop.KindUDP, Tunnel: key, Route: route[1:], Target: dst.String()},
			// A flow's datagrams, as the QUIC session they always were.
			nexthop.OpenOptions{Came: v1alpha1.TransportQUIC})
		if err != nil {
			f.hopFailed(key, err)
			return
		}
		out := next.Session(nexthop.SessionOptions{Share: queueShare(t, key)})
		send = out.Send
		reply := func(p []byte) {
			if _, err := c.Write(p); err == nil {
				fc.down.Add(float64(len(p)))
			}
		}
		out.Receive(reply)
		defer out.End(hop.CodeReset)
		go func() {
			out.ReadFrames(reply, nil) // oversize replies; the stream's end ends the flow
			c.Close()
		}()
	}
	cancel()
	idle := udpIdle(t)
	buf := make([]byte, hop.MaxFrame)
	for {
		c.SetReadDeadline(time.Now().Add(idle))
		n, err := c.Read(buf)
		if err != nil {
			return // idle, or ended
		}
		if send(buf[:n]) == nil {
			fc.up.Add(float64(n))
		}
	}
}

// copyPackets copies datagrams from src to dst until either fails.
func copyPackets(src, dst net.Conn, n flow.Counter) {
	buf := make([]byte, hop.MaxFrame)
	for {
		k, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if _, err := dst.Write(buf[:k]); err == nil {
			n.Add(float64(k))
		}
	}
}

// echoTable is a flow-mode Tunnel's echo sessions at its entry, one per
// (source, destination, identifier) of the pings its device reads.
type echoTable struct {
	f   *tunFlows
	dev *tun.Device
	t   *v1alpha1.Tunnel
	key string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[echoKey]chan tun.Echo // each session's requests, bounded
}

type echoKey struct {
	src, dst netip.Addr
	id       uint16
}

func (f *tunFlows) newEchoTable(dev *tun.Device, t *v1alpha1.Tunnel, key string) *echoTable {
	e := &echoTable{f: f, dev: dev, t: t, key: key, sessions: map[echoKey]chan tun.Echo{}}
	e.ctx, e.cancel = context.WithCancel(f.ctx)
	return e
}

// close ends the sessions and waits for them.
func (e *echoTable) close() {
	e.cancel()
	e.wg.Wait()
}

// request takes an echo request the device read: it joins its session, or
// starts one. It never blocks the device's reads: a full table or queue
// drops the request, which the ping counts as lost.
func (e *echoTable) request(r tun.Echo) {
	k := echoKey{r.Src, r.Dst, r.ID}
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.sessions[k]
	if q == nil {
		if len(e.sessions) >= maxEchoSessions || e.ctx.Err() != nil {
			e.dev.Stats.Dropped("echo_limit")
			return
		}
		q = make(chan tun.Echo, echoQueue)
		e.sessions[k] = q
		e.dev.Stats.Flowed("icmp")
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.run(k, q)
			e.mu.Lock()
			delete(e.sessions, k)
			e.mu.Unlock()
		}()
	}
	select {
	case q <- r:
	default:
		e.dev.Stats.Dropped("queue_full")
	}
}

// run carries a session's requests to the exit, which pings the
// destination, and writes into the device a reply for each request whose
// destination answered there, until no request comes for echoIdle.
func (e *echoTable) run(k echoKey, q chan tun.Echo) {
	f := e.f
	if !f.acquire(e.key, netip.Addr{}) {
		return
	}
	defer f.release(e.key, netip.Addr{})
	var wait echoWait
	reply := func(seq uint16, data []byte) {
		if !wait.take(seq) {
			return
		}
		if pkt := tun.EchoReply(tun.Echo{Src: k.src, Dst: k.dst, ID: k.id, Seq: seq, Data: data}); pkt != nil {
			e.dev.WritePacket(nil, pkt)
		}
	}
	// The exit has no route to the destination: a destination
	// unreachable, from it, about the request.
	noRoute := func(code uint8, seq uint16, data []byte) {
		if !wait.take(seq) {
			return
		}
		if pkt := tun.EchoUnreachable(tun.Echo{Src: k.src, Dst: k.dst, ID: k.id, Seq: seq, Data: data}, code); pkt != nil {
			e.dev.WritePacket(nil, pkt)
		}
	}
	ctx, cancel := f.setupContext()
	defer cancel()
	_, route, err := f.udp.routes.routeOf(ctx, e.t)
	if err != nil {
		f.hopFailed(e.key, err)
		return
	}
	var send func(seq uint16, data []byte) error
	ended := make(chan struct{})
	if len(route) == 1 {
		// The entry is the exit: it pings the destination itself.
		if err := f.egress.Check(k.dst); err != nil {
			f.dialFailed(e.key, k.dst.String(), err)
			return
		}
		p, err := openPinger(k.dst)
		if err != nil {
			e.dev.Stats.Dropped("no_icmp_socket")
			f.warn.Warn("cannot ping through a tun Tunnel", "tunnel", e.key, "target", k.dst, "err", err)
			return
		}
		send = func(seq uint16, data []byte) error {
			err := p.send(seq, data)
			if code, ok := unreachable(err, k.dst.Is6()); ok {
				noRoute(code, seq, data)
			}
			return err
		}
		go func() {
			defer close(ended)
			p.receive(reply, func() bool { return false }) // until closed
		}()
		defer func() { p.close(); <-ended }()
	} else {
		next, err := f.udp.hops.Open(ctx, &hop.Header{Kind: hop.KindEcho, Tunnel: e.key, Route: route[1:], Target: netip.AddrPortFrom(k.dst, 0).String()},
			// As a flow's UDP datagrams: the QUIC session they ride.
			nexthop.OpenOptions{Came: v1alpha1.TransportQUIC})
		if err != nil {
			f.hopFailed(e.key, err)
			return
		}
		out := next.Session(nexthop.SessionOptions{Share: queueShare(e.t, e.key)})
		proto, req, rep := echoTypes(k.dst.Is6())
		deliver := func(b []byte) {
			if m, ok := parseEcho(proto, rep, b); ok {
				reply(uint16(m.Seq), m.Data)
			} else if code, m, ok := parseUnreachable(k.dst.Is6(), b); ok {
				noRoute(code, uint16(m.Seq), m.Data)
			}
		}
		out.Receive(deliver)
		defer out.End(hop.CodeIdle)
		go func() {
			defer close(ended)
			out.ReadFrames(deliver, nil) // until the exit ends the session
		}()
		send = func(seq uint16, data []byte) error { return out.Send(marshalEcho(req, int(k.id), seq, data)) }
	}
	cancel()
	idle := time.NewTimer(echoIdle)
	defer idle.Stop()
	for {
		select {
		case r := <-q:
			wait.add(r.Seq)
			if send(r.Seq, r.Data) != nil {
				e.dev.Stats.Dropped("send_failed")
			}
			idle.Reset(echoIdle)
		case <-idle.C:
			return
		case <-ended:
			return
		case <-e.ctx.Done():
			return
		}
	}
}
