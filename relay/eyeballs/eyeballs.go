// Package eyeballs dials a peer that publishes endpoints of both IP
// families the way RFC 8305 (Happy Eyeballs v2) asks: addresses ordered
// with the families interleaved, IPv6 first, each attempt started a short
// delay after the one before (or at once when that one failed), the first
// to connect kept and the others cancelled. A relay whose peer has an IPv6
// address that is dead on the path so comes up on IPv4 in a quarter of a
// second rather than after a handshake timeout, and the other way round.
package eyeballs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Delay is how long an attempt has before the next address's starts: RFC
// 8305's recommended Connection Attempt Delay.
const Delay = 250 * time.Millisecond

// The families as metrics and status name them.
const (
	IPv4 = "ipv4"
	IPv6 = "ipv6"
)

// Family names a's IP family; an IPv4-mapped IPv6 address is IPv4, as it
// is on the wire.
func Family(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// FamilyOf is the family of a UDP or TCP address, "" for anything else.
func FamilyOf(a net.Addr) string {
	switch a := a.(type) {
	case *net.UDPAddr:
		return Family(a.AddrPort().Addr())
	case *net.TCPAddr:
		return Family(a.AddrPort().Addr())
	}
	return ""
}

// Order sorts addresses for dialing: IPv6 and IPv4 alternate, IPv6 first,
// each family in the order given, repeats dropped. Alternating rather than
// all of one family first means a family that is dead on the path costs
// one Delay, not one per address.
func Order(addrs []netip.AddrPort) []netip.AddrPort {
	var v6, v4 []netip.AddrPort
	seen := map[netip.AddrPort]bool{}
	for _, a := range addrs {
		a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
		if seen[a] {
			continue
		}
		seen[a] = true
		if a.Addr().Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	out := make([]netip.AddrPort, 0, len(v6)+len(v4))
	for i := range max(len(v6), len(v4)) {
		if i < len(v6) {
			out = append(out, v6[i])
		}
		if i < len(v4) {
			out = append(out, v4[i])
		}
	}
	return out
}

// Resolver looks names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Resolve turns host:port endpoints into addresses: an IP literal as it is,
// a name into every address of both families it has. The error tells of
// the endpoints that gave none; the addresses of the others are still
// returned, so one stale name does not stop a peer being dialed.
func Resolve(ctx context.Context, r Resolver, endpoints []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	var errs []error
	for _, ep := range endpoints {
		if ap, err := netip.ParseAddrPort(ep); err == nil {
			out = append(out, ap)
			continue
		}
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p, err := net.LookupPort("udp", port)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		ips, err := r.LookupNetIP(ctx, "ip", host)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		for _, ip := range ips {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
		}
	}
	return out, errors.Join(errs...)
}

// Reachable says whether a socket bound to local can send to remote: one
// bound to an unspecified address ([::] in Go is dual-stack, and so is
// 0.0.0.0) reaches both families, one bound to an address only its own.
func Reachable(local, remote netip.Addr) bool {
	local, remote = local.Unmap(), remote.Unmap()
	if !local.IsValid() || local.IsUnspecified() {
		return true
	}
	return local.Is4() == remote.Is4()
}

// ErrNoAddress is a race with nothing to dial.
var ErrNoAddress = errors.New("no address to dial")

// Race dials addrs in order, each attempt delay after the one before or at
// once when an attempt fails, and returns the first that
// connects with its address. The others are cancelled; one that connects
// all the same is handed to discard (nil: dropped). Every attempt failing,
// the error joins theirs in address order.
func Race[T any](ctx context.Context, addrs []netip.AddrPort, delay time.Duration,
	dial func(context.Context, netip.AddrPort) (T, error), discard func(T)) (T, netip.AddrPort, error) {
	var zero T
	if len(addrs) == 0 {
		return zero, netip.AddrPort{}, ErrNoAddress
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		v   T
		err error
	}
	// Buffered for every attempt: losers finish after Race has returned.
	results := make(chan result, len(addrs))
	errs := make([]error, len(addrs))
	started, pending := 0, 0
	start := func() {
		i := started
		started++
		pending++
		go func() {
			v, err := dial(ctx, addrs[i])
			results <- result{i, v, err}
		}()
	}
	start()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for pending > 0 {
		var next <-chan time.Time
		if started < len(addrs) {
			next = timer.C
		}
		select {
		case <-next:
			if ctx.Err() == nil { // called off: the pending attempts end
				start()
				timer.Reset(delay)
			}
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				go func(n int) {
					for range n {
						if o := <-results; o.err == nil && discard != nil {
							discard(o.v)
						}
					}
				}(pending)
				return r.v, addrs[r.i], nil
			}
			errs[r.i] = r.err
			if started < len(addrs) && ctx.Err() == nil {
				start()
				timer.Reset(delay)
			}
		}
	}
	return zero, netip.AddrPort{}, errors.Join(errs...)
}
