//go:build linux

package relay

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/netstack"
	"github.com/hoplink/hoplink/relay/tun"
)

// openTUN opens a tun Tunnel on its entry relay: the device with its
// address and routes and, in flow mode, a userspace TCP/IP stack on it
// whose flows ride the chain as a TCP or UDP Tunnel's do, each toward its
// own destination. The returned stop removes the device and its routes.
func (r *Relay) openTUN(t *v1alpha1.Tunnel, key string) (stop func(), err error) {
	u := t.Spec.TUN
	addr, err := netip.ParsePrefix(u.Address)
	if err != nil {
		return nil, fmt.Errorf("spec.tun.address: %w", err)
	}
	var routes []netip.Prefix
	for _, s := range u.Routes {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("spec.tun.routes: %w", err)
		}
		routes = append(routes, p)
	}
	dev, err := tun.Open(tun.Config{Name: u.Name, Address: addr, MTU: int(u.MTU), Routes: routes, Offload: !r.cfg.NoTUNOffload})
	if err != nil {
		return nil, err
	}
	stats := r.tunStats(key)
	switch u.Mode {
	case v1alpha1.TunPacket:
		r.cfg.Log.Info("tun device up", "tunnel", key, "device", dev.Name, "offload", dev.Offload)
		return r.startPacketEntry(t, key, dev, stats), nil
	default:
		var sessions atomic.Int64
		st, err := netstack.New(netstack.Options{
			Device: dev.File(), Offload: dev.Offload, MTU: int(u.MTU),
			Allowed: func(a netip.Addr) bool { return manifest.PrefixesHold(u.Routes, a) },
			TCP:     func(c *netstack.TCPConn, dst netip.AddrPort) { r.entryTunTCP(c, dst, t, key) },
			UDP: func(c net.Conn, src, dst netip.AddrPort) {
				defer c.Close()
				if sessions.Add(1) > v1alpha1.DefaultUDPMaxSessions {
					sessions.Add(-1)
					stats.Drop("session_limit")
					return
				}
				defer sessions.Add(-1)
				r.entryTunUDP(c, dst, t, key)
			},
			Stats: stats,
		})
		if err != nil {
			dev.Close()
			return nil, err
		}
		r.cfg.Log.Info("tun device up", "tunnel", key, "device", dev.Name, "offload", dev.Offload)
		return func() {
			dev.Close() // first: it ends the stack's reads
			st.Close()
		}, nil
	}
}

// tunStats counts a tun Tunnel's packets in the relay's metrics.
func (r *Relay) tunStats(key string) *netstack.Stats {
	m, name := r.cfg.Metrics, r.cfg.Name
	pin, pout := m.TUNPackets.WithLabelValues(name, key, "in"), m.TUNPackets.WithLabelValues(name, key, "out")
	bin, bout := m.TUNBytes.WithLabelValues(name, key, "in"), m.TUNBytes.WithLabelValues(name, key, "out")
	return &netstack.Stats{
		In:   func(p, n int) { pin.Add(float64(p)); bin.Add(float64(n)) },
		Out:  func(p, n int) { pout.Add(float64(p)); bout.Add(float64(n)) },
		Drop: func(reason string) { m.TUNDropped.WithLabelValues(name, key, reason).Inc() },
		Flow: func(proto string) { m.TUNFlows.WithLabelValues(name, key, proto).Inc() },
	}
}

// entryTunTCP carries a TCP flow of a tun Tunnel's stack to its
// destination.
func (r *Relay) entryTunTCP(c *netstack.TCPConn, dst netip.AddrPort, t *v1alpha1.Tunnel, key string) {
	if !r.acquire() {
		r.flowError(key, "flow_limit")
		c.Abort()
		return
	}
	defer r.release()
	r.entryFlow(&stackEnd{c: c}, t, key, dst.String())
}

// stackEnd is a TCP flow terminated in a tun Tunnel's stack.
type stackEnd struct{ c *netstack.TCPConn }

func (e *stackEnd) Read(b []byte) (int, error)  { return e.c.Read(b) }
func (e *stackEnd) Write(b []byte) (int, error) { return e.c.Write(b) }
func (e *stackEnd) wait() error                 { return nil }
func (e *stackEnd) closeWrite() error           { return e.c.CloseWrite() }
func (e *stackEnd) abort()                      { e.c.Abort() }
func (e *stackEnd) fail(quicgo.StreamErrorCode) { e.c.Abort() }
func (e *stackEnd) close()                      { e.c.Close() }

// entryTunUDP carries a UDP flow of a tun Tunnel's stack (one source and
// destination pair) to its destination as a UDP session: datagrams, and
// frames on the session's stream for packets too large for one.
func (r *Relay) entryTunUDP(c net.Conn, dst netip.AddrPort, t *v1alpha1.Tunnel, key string) {
	if !r.acquire() {
		r.flowError(key, "flow_limit")
		return
	}
	defer r.release()
	fm, done := r.begin(key, "entry")
	defer done()
	gauge := r.cfg.Metrics.UDPSessions.WithLabelValues(r.cfg.Name, key, "entry")
	gauge.Inc()
	defer gauge.Dec()
	ctx, cancel := r.setupContext()
	defer cancel()
	var route []string
	err := errors.New("the Tunnel's chain is gone")
	if chain := r.set.Load().ChainOf(t); chain != nil {
		route, err = r.routeOf(ctx, chain)
	}
	if err != nil {
		r.flowError(key, "no_route")
		return
	}
	var send func([]byte) error
	if len(route) == 1 {
		// The entry is the exit.
		tc, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			r.flowError(key, "dial_target")
			return
		}
		defer tc.Close()
		send = func(p []byte) error { _, err := tc.Write(p); return err }
		go copyPackets(tc, c, fm.down)
	} else {
		conn, st, err := r.nextHop(ctx, &hop.Header{Kind: hop.KindUDP, Tunnel: key, Route: route[1:], Target: dst.String()})
		if err != nil {
			r.flowError(key, "next_hop")
			return
		}
		out := newPacketSender(conn, st)
		send = out.send
		reply := func(p []byte) {
			if _, err := c.Write(p); err == nil {
				fm.down.Add(float64(len(p)))
			}
		}
		conn.Register(out.id, reply)
		defer conn.Unregister(out.id)
		defer resetStream(st, hop.CodeReset)
		go func() {
			readFrames(st, reply) // oversize replies; the stream's end ends the flow
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
			fm.up.Add(float64(n))
		}
	}
}

// copyPackets copies datagrams from src to dst until either fails.
func copyPackets(src, dst net.Conn, n prometheus.Counter) {
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
