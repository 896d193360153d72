package relay

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/udpio"
)

// exit joins a session's last hop to its target through a connected UDP
// socket of its own.
func (f *udpFlows) exit(from *nexthop.Hop, h *hop.Header, t *v1alpha1.Tunnel) {
	framed := f.framed(h.Tunnel, "exit", h.Target)
	// Replies go back to the previous relay within the Tunnel's share of
	// that link.
	fair, share, leave := f.shareDatagrams(t, from.Peer)
	defer leave()
	back := from.Session(nexthop.SessionOptions{Mode: udpMode(t), Share: share, Bulk: func(turned bool) {
		if turned {
			framed()
		}
	}})
	// The entry keeps maxSessions in its table; a previous hop that opens
	// more (hostile, or an entry's ended sessions not yet ended here) is
	// held to it too. A place freed within sessionWait is taken: an entry
	// that ended a session and started another may be heard in that order
	// or the other.
	limit := udpMaxSessions(t)
	if !f.exits.take(f.ctx, h.Tunnel, limit, sessionWait) {
		f.m.UDPDropped.WithLabelValues(f.name, h.Tunnel, "session_limit").Inc()
		f.warn.Warn("udp session refused at the exit: the Tunnel has its maxSessions open", "tunnel", h.Tunnel, "max_sessions", limit)
		back.End(hop.CodeRejected)
		return
	}
	defer f.exits.give(h.Tunnel)
	fc, done := f.begin(h.Tunnel, "exit")
	defer done()
	start := time.Now()
	tc, err := dialUDP(f.egress, h.Target)
	if err != nil {
		if egress.IsRefused(err) {
			f.dialFailed(h.Tunnel, h.Target, err)
		} else {
			f.flowError(h.Tunnel, "dial_target")
			f.log.Warn("cannot reach target", "tunnel", h.Tunnel, "target", h.Target, "err", err)
		}
		back.End(hop.CodeDialFailed)
		return
	}
	f.m.FlowSetup.WithLabelValues(f.name, h.Tunnel, "exit").Observe(time.Since(start).Seconds())
	gauge := f.m.UDPSessions.WithLabelValues(f.name, h.Tunnel, "exit")
	gauge.Inc()
	defer gauge.Dec()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	// The target's socket is written off the datagram goroutine, in
	// batches: a write per datagram there would hold up every session of
	// the connection, and QUIC drops datagrams that wait.
	toTargetW := udpio.NewWriter(tc, func(n int) { fc.up.Add(float64(n)) }, func() {
		f.m.UDPDropped.WithLabelValues(f.name, h.Tunnel, "write_failed").Inc()
	})
	defer toTargetW.Close()
	full := f.m.UDPDropped.WithLabelValues(f.name, h.Tunnel, "queue_full")
	// With spec.proxyProtocol every datagram starts with the client's
	// address (v2).
	proxy := proxyHeader(t, true, h.Client, h.Listener)
	toTarget := func(p []byte) {
		last.Store(time.Now().UnixNano())
		if proxy != nil {
			p = append(proxy[:len(proxy):len(proxy)], p...)
		}
		if !toTargetW.Write(p) {
			full.Inc()
		}
	}
	back.Receive(toTarget)

	// Frames toward the target; the hop's end ends the session at once,
	// and with it its place in the Tunnel's sessions: it wakes the read of
	// replies below, whose deadline it sets under wake.
	streamDone := make(chan struct{})
	var wake sync.Mutex
	var endedHere atomic.Bool // the exit ended it: its hop's end is no error
	var broken atomic.Bool    // the previous hop broke it
	go func() {
		if err := back.ReadFrames(toTarget, nil); !endedHere.Load() && hopBroken(err) {
			f.flowError(h.Tunnel, sidePrevHop)
			broken.Store(true)
		}
		wake.Lock()
		close(streamDone)
		tc.SetReadDeadline(time.Now())
		wake.Unlock()
	}()
	// Replies from the target. The idle timeout also holds here, so an exit
	// never keeps a session whose entry vanished.
	idle := udpIdle(t)
	rateLimit, overRate := f.downRate(t)
	buf := make([]byte, hop.MaxFrame)
	for {
		wake.Lock()
		select {
		case <-streamDone:
		default:
			tc.SetReadDeadline(time.Now().Add(min(idle, time.Second)))
		}
		wake.Unlock()
		n, err := tc.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			switch {
			case !allow(rateLimit, n):
				overRate.Inc()
			case !fair.admit(n):
			default:
				fair.start()
				err := back.Send(buf[:n])
				if err == nil {
					err = back.Flush()
				}
				fair.end(sentLen(buf[:n], err))
				if err == nil {
					fc.down.Add(float64(n))
				}
			}
		}
		select {
		case <-streamDone:
			tc.Close()
			if broken.Load() {
				back.End(hop.CodeReset)
			} else {
				back.End(hop.CodeIdle) // an end, answered as one
			}
			return
		default:
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			break
		}
		if time.Since(time.Unix(0, last.Load())) > idle {
			break
		}
	}
	tc.Close()
	endedHere.Store(true)
	back.End(hop.CodeIdle)
	<-streamDone
}

// sessionWait is how long a session past its Tunnel's maxSessions at the
// exit waits for a place before it is refused.
const sessionWait = time.Second

// udpMaxSessions bounds a Tunnel's UDP sessions: its spec's, or the
// default for a tun Tunnel's UDP flows.
func udpMaxSessions(t *v1alpha1.Tunnel) int {
	if t.Spec.UDP != nil && t.Spec.UDP.MaxSessions > 0 {
		return int(t.Spec.UDP.MaxSessions)
	}
	return v1alpha1.DefaultUDPMaxSessions
}

// sessionSlots counts open sessions by Tunnel, at most a given number
// each; the zero value is ready.
type sessionSlots struct {
	mu   sync.Mutex
	open map[string]*tunnelSlots
}

type tunnelSlots struct {
	n     int
	freed chan struct{} // closed when a place is given back, if anyone waits
}

// take takes one of tunnel's limit places, waiting up to wait for one.
func (s *sessionSlots) take(ctx context.Context, tunnel string, limit int, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.open == nil {
			s.open = map[string]*tunnelSlots{}
		}
		ts := s.open[tunnel]
		if ts == nil {
			ts = &tunnelSlots{}
			s.open[tunnel] = ts
		}
		if ts.n < limit {
			ts.n++
			s.mu.Unlock()
			return true
		}
		if ts.freed == nil {
			ts.freed = make(chan struct{})
		}
		freed := ts.freed
		s.mu.Unlock()
		select {
		case <-freed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// give gives a place of tunnel back.
func (s *sessionSlots) give(tunnel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.open[tunnel]
	ts.n--
	if ts.freed != nil {
		close(ts.freed)
		ts.freed = nil
	}
	if ts.n <= 0 {
		delete(s.open, tunnel)
	}
}
