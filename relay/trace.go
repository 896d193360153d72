package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/errlist"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/relay/admit"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
	"github.com/hoplink/hoplink/relay/probe"
)

// A trace measures a route of a routed chain end to end: a stream that
// travels the route as a TCP flow would, over the chain's transport and
// checked at every hop, and that the exit answers at once with one byte.

// traceAnswer is the exit's one-byte answer to a trace.
const traceAnswer = 1

// tracesPerRoute is how many traces measure one route in a round; the
// median is kept.
const tracesPerRoute = 3

// traceTimeout bounds a trace at every hop: one slower than this measures
// nothing worth having, and it must not hold a flow token while a peer
// that never closes it waits.
var traceTimeout = nexthop.HeaderTimeout

// serveTrace carries an admitted trace one hop further, or answers it at
// the exit, within traceTimeout.
func (m *measurer) serveTrace(in flow.End, h *hop.Header, c *v1alpha1.Chain) {
	if !m.acquireUpTo(h.Tunnel, netip.Addr{}, 0) {
		in.Fail(hop.CodeRejected)
		return
	}
	defer m.release(h.Tunnel, netip.Addr{})
	var mu sync.Mutex
	var out flow.End
	expire := time.AfterFunc(traceTimeout, func() {
		in.Abort()
		mu.Lock()
		if out != nil {
			out.Abort()
		}
		mu.Unlock()
	})
	defer expire.Stop()
	if len(h.Route) == 1 {
		// The asker sends nothing after the header, so EOF comes with it;
		// then the answer.
		io.Copy(io.Discard, io.LimitReader(in, 1))
		if _, err := in.Write([]byte{traceAnswer}); err != nil {
			in.Abort()
			return
		}
		in.CloseWrite()
		in.Close()
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, traceTimeout)
	next, err := m.hops.Open(ctx, nexthop.Onward(h), nexthop.OpenOptions{Transport: c.Spec.Transport})
	cancel()
	if err != nil {
		in.Fail(hop.CodeNextHop)
		return
	}
	mu.Lock()
	out = next.Stream()
	mu.Unlock()
	flow.Join(in, next.Stream(), noCount{}, noCount{}, 0) // traceTimeout bounds it
}

// Trace measures routes of a chain this relay enters, end to end: for
// each, a few traces through the real relays, to the exit and back.
func (m *measurer) Trace(ctx context.Context, c *v1alpha1.Chain, routes [][]string) ([]measure.Trace, error) {
	out := make([]measure.Trace, len(routes))
	var wg sync.WaitGroup
	for i, rt := range routes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = m.traceRoute(ctx, c, rt)
		}()
	}
	wg.Wait()
	return out, nil
}

func (m *measurer) traceRoute(ctx context.Context, c *v1alpha1.Chain, rt []string) measure.Trace {
	res := measure.Trace{Route: rt}
	if ref := admit.TraceRoute(c, m.name, rt); ref != nil {
		res.Err = ref.Error()
		return res
	}
	// A trace cut by the round's deadline fails with the stream's reset
	// (its number differs each time): said as what it means, once.
	noAnswer := errors.New("no answer through the route")
	if dl, ok := ctx.Deadline(); ok {
		noAnswer = fmt.Errorf("no answer through the route within %s", time.Until(dl).Round(time.Millisecond))
	}
	rtts := make([]time.Duration, tracesPerRoute)
	errs := make([]error, tracesPerRoute)
	var wg sync.WaitGroup
	for i := range tracesPerRoute {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the traces so that each rides its own packets.
			select {
			case <-time.After(time.Duration(i) * probe.DefaultGap):
			case <-ctx.Done():
			}
			rtts[i], errs[i] = m.traceOnce(ctx, c, rt)
			if errs[i] != nil && ctx.Err() != nil {
				errs[i] = noAnswer
			}
		}()
	}
	wg.Wait()
	var ok []time.Duration
	for i, d := range rtts {
		if errs[i] == nil {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		res.Err = errlist.Distinct(errs).Error()
		return res
	}
	slices.Sort(ok)
	res.RTT = measure.Duration(ok[len(ok)/2])
	return res
}

func (m *measurer) traceOnce(ctx context.Context, c *v1alpha1.Chain, rt []string) (time.Duration, error) {
	start := time.Now()
	next, err := m.hops.Open(ctx, &hop.Header{Kind: hop.KindTrace, Tunnel: manifest.Key(c.Namespace, c.Name), Route: rt[1:]}, nexthop.OpenOptions{Transport: c.Spec.Transport})
	if err != nil {
		return 0, err
	}
	out := next.Stream()
	stop := context.AfterFunc(ctx, out.Abort)
	defer stop()
	if err := out.CloseWrite(); err != nil {
		out.Abort()
		return 0, err
	}
	var b [1]byte
	if _, err := io.ReadFull(out, b[:]); err != nil {
		out.Abort()
		return 0, err
	}
	d := time.Since(start)
	if b[0] != traceAnswer {
		out.Abort()
		return 0, fmt.Errorf("unexpected answer %d from the exit", b[0])
	}
	io.Copy(io.Discard, io.LimitReader(out, 1)) // the exit's EOF
	out.Close()
	return d, nil
}
