package relay

import (
	"errors"
	"net"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/probe"
)

// serveTCP accepts the clients of a TCP Tunnel on its entry relay.
func (r *Relay) serveTCP(ln *net.TCPListener, t *v1alpha1.Tunnel) {
	key := manifest.Key(t.Namespace, t.Name)
	var backoff time.Duration
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errorsIsClosed(err) {
				return
			}
			// Out of file descriptors and the like: slow down, keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			r.cfg.Log.Warn("accept failed", "tunnel", key, "err", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !r.acquire() {
			r.flowError(key, "flow_limit")
			c.SetLinger(0)
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.release()
			r.entryTCP(c, t, key)
		}()
	}
}

// entryTCP carries one client connection of a TCP Tunnel into the chain.
func (r *Relay) entryTCP(c *net.TCPConn, t *v1alpha1.Tunnel, key string) {
	a, err := newTCPEnd(c)
	if err != nil {
		c.Close()
		return
	}
	r.entryFlow(a, t, key, t.Spec.Target)
}

// entryFlow carries one flow into the chain toward target: a TCP Tunnel's
// client, or a TCP flow a tun Tunnel's stack terminated.
func (r *Relay) entryFlow(in end, t *v1alpha1.Tunnel, key, target string) {
	start := time.Now()
	fm, done := r.begin(key, "entry")
	defer done()
	ctx, cancel := r.setupContext()
	defer cancel()
	var route []string
	err := errors.New("the Tunnel's chain is gone")
	chain := r.set.Load().ChainOf(t)
	if chain != nil {
		route, err = r.routeOf(ctx, chain)
	}
	if err != nil {
		r.flowError(key, "no_route")
		r.cfg.Log.Warn("no route for flow", "tunnel", key, "err", err)
		in.abort()
		return
	}
	if len(route) == 1 {
		// The entry is the exit: a plain port forward, spliced in the
		// kernel when both ends are sockets.
		tc, err := r.dialTarget(key, target, "entry", start)
		if err != nil {
			in.abort()
			return
		}
		if a, ok := in.(*tcpEnd); ok {
			spliceTCP(a.c, tc, fm.up, fm.down)
			return
		}
		b, err := newTCPEnd(tc)
		if err != nil {
			in.abort()
			tc.Close()
			return
		}
		pipe(in, b, fm.up, fm.down)
		return
	}
	out, err := r.nextHopEnd(ctx, &hop.Header{Kind: hop.KindTCP, Tunnel: key, Route: route[1:], Target: target}, chain.Spec.Transport)
	cancel()
	if err != nil {
		r.flowError(key, "next_hop")
		r.cfg.Log.Warn("next hop unavailable", "tunnel", key, "next", route[1], "err", err)
		in.abort()
		return
	}
	r.cfg.Metrics.FlowSetup.WithLabelValues(r.cfg.Name, key, "entry").Observe(time.Since(start).Seconds())
	pipe(in, out, fm.up, fm.down)
}

// exitTCP connects a flow to its target.
func (r *Relay) exitTCP(in end, h *hop.Header) {
	start := time.Now()
	fm, done := r.begin(h.Tunnel, "exit")
	defer done()
	tc, err := r.dialTarget(h.Tunnel, h.Target, "exit", start)
	if err != nil {
		in.fail(hop.CodeDialFailed)
		return
	}
	b, err := newTCPEnd(tc)
	if err != nil {
		in.abort()
		tc.Close()
		return
	}
	pipe(in, b, fm.up, fm.down)
}

func (r *Relay) dialTarget(tunnel, target, role string, start time.Time) (*net.TCPConn, error) {
	ctx, cancel := r.setupContext()
	defer cancel()
	var d net.Dialer
	dialStart := time.Now()
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		r.flowError(tunnel, "dial_target")
		r.cfg.Log.Warn("cannot connect to target", "tunnel", tunnel, "target", target, "err", err)
		return nil, err
	}
	// A real connect is a measurement of the target too.
	r.targets.Observe(probe.TargetSpec{Tunnel: tunnel, Target: target}, time.Since(dialStart))
	r.cfg.Metrics.FlowSetup.WithLabelValues(r.cfg.Name, tunnel, role).Observe(time.Since(start).Seconds())
	return c.(*net.TCPConn), nil
}
