package local

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/manifest"
)

// AnnotationRTT on a RelayNode asks local mode to emulate its links to the
// relays named as if they were far apart: "seattle=10ms, la=40ms" adds
// 10 ms to each round trip between this relay and seattle, and 40 ms to
// those with la, whichever of the two dials. On one machine every link is a
// loopback of a fraction of a millisecond, so without it a routed chain's
// choice is down to noise. Other modes leave it alone: their links have
// real round trips.
const AnnotationRTT = "hoplink.dev/local-rtt"

// Link is an emulated link between two relays, A before B by name.
type Link struct {
	A, B string
	RTT  time.Duration
}

// EmulatedLinks reads AnnotationRTT of every RelayNode of set, sorted by
// relay names. A mistake names the RelayNode, the annotation and the fix.
func EmulatedLinks(set *manifest.Set) ([]Link, error) {
	byPair := map[[2]string]string{} // the RelayNode that gave each pair
	var links []Link
	var errs []error
	for _, rn := range set.Relays {
		v, ok := rn.Annotations[AnnotationRTT]
		if !ok {
			continue
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: RelayNode %q: metadata.annotations[%s]: %s", set.Source(rn), rn.Name, AnnotationRTT, fmt.Sprintf(format, args...)))
		}
		for item := range strings.SplitSeq(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			peer, d, found := strings.Cut(item, "=")
			peer, d = strings.TrimSpace(peer), strings.TrimSpace(d)
			rtt, err := time.ParseDuration(d)
			switch {
			case !found || err != nil || rtt < 0 || rtt > time.Minute:
				bad("%q: want RELAY=ROUND_TRIP, a duration from 0 to 1m (\"la=40ms, seattle=10ms\")", item)
				continue
			case peer == rn.Name:
				bad("%q: a relay has no link to itself", item)
				continue
			case set.Relay(peer) == nil:
				bad("%q: unknown RelayNode %q (known: %s)%s", item, peer, strings.Join(set.RelayNames(), ", "), manifest.DidYouMean(peer, set.RelayNames()))
				continue
			}
			pair := [2]string{min(rn.Name, peer), max(rn.Name, peer)}
			if first, dup := byPair[pair]; dup {
				bad("%q: the link %s-%s is given on RelayNode %q already; give it once", item, pair[0], pair[1], first)
				continue
			}
			byPair[pair] = rn.Name
			links = append(links, Link{A: pair[0], B: pair[1], RTT: rtt})
		}
	}
	slices.SortFunc(links, func(x, y Link) int { return strings.Compare(x.A+"\x00"+x.B, y.A+"\x00"+y.B) })
	return links, errors.Join(errs...)
}

// emulation is the proxies that stand between relays whose links are
// emulated: one pair (UDP for QUIC, TCP for TLS, on the same port, as a
// relay's endpoint) per dialing relay and peer endpoint.
type emulation struct {
	// endpoints, per dialing relay, are what it dials instead of each peer's
	// own endpoints.
	endpoints map[string]map[string][]string
	closers   []io.Closer
}

// emulate starts the proxies of links: for each relay, one toward every
// endpoint of each peer it shares an emulated link with. Each direction
// gets half the round trip.
func emulate(set *manifest.Set, links []Link) (*emulation, error) {
	e := &emulation{endpoints: map[string]map[string][]string{}}
	for _, l := range links {
		oneWay := linkemu.Params{Delay: l.RTT / 2}
		for _, dir := range [][2]string{{l.A, l.B}, {l.B, l.A}} {
			from, to := dir[0], dir[1]
			var eps []string
			for _, ep := range set.Relay(to).Spec.Endpoints {
				addr, err := e.proxy(ep, oneWay)
				if err != nil {
					e.Close()
					return nil, fmt.Errorf("emulated link %s-%s: %w", l.A, l.B, err)
				}
				eps = append(eps, addr)
			}
			if len(eps) == 0 {
				continue // nothing dials it
			}
			if e.endpoints[from] == nil {
				e.endpoints[from] = map[string][]string{}
			}
			e.endpoints[from][to] = eps
		}
	}
	return e, nil
}

// proxy forwards a port of the endpoint's host to the endpoint, UDP and
// TCP alike, delaying each direction by p, and returns its address.
func (e *emulation) proxy(endpoint string, p linkemu.Params) (string, error) {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", err
	}
	// QUIC and TLS share a relay's port number, so the proxies do too:
	// a UDP port is taken first, then the same TCP port, which another
	// process may hold; a few tries find one free for both.
	var lastErr error
	for range 20 {
		u, err := linkemu.NewUDPProxy(net.JoinHostPort(host, "0"), endpoint, p)
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(u.Addr())
		t, err := linkemu.NewTCPProxy(net.JoinHostPort(host, port), endpoint, p)
		if err != nil {
			u.Close()
			lastErr = err
			continue
		}
		e.closers = append(e.closers, u, t)
		return net.JoinHostPort(host, port), nil
	}
	return "", fmt.Errorf("no port free for both UDP and TCP on %s: %w", host, lastErr)
}

// Close stops every proxy.
func (e *emulation) Close() error {
	var errs []error
	for _, c := range e.closers {
		errs = append(errs, c.Close())
	}
	e.closers = nil
	return errors.Join(errs...)
}
