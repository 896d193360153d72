// Package local runs every relay of a set of manifests in one process, with
// an ephemeral CA made in memory: the quickest way to see a chain work, and
// what tests use to exercise the real data plane.
package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hoplink/hoplink/internal/logs"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/routectl"
)

// Network is the running relays of one manifest set.
type Network struct {
	Relays []*relay.Relay
	CA     *pki.CA
	// Links are the emulated links (AnnotationRTT).
	Links []Link
	emu   *emulation
}

// Start starts every relay, each configured as base says (metrics, log,
// limits) with its own name and certificate. All relays share this host,
// so listeners that would collide are refused before anything binds.
func Start(set *manifest.Set, base relay.Config) (*Network, error) {
	log := base.Log
	if log == nil {
		log = slog.Default()
	}
	if err := set.CheckSingleHost(); err != nil {
		return nil, err
	}
	links, err := EmulatedLinks(set)
	if err != nil {
		return nil, err
	}
	ca, err := pki.NewCA("hoplink local CA")
	if err != nil {
		return nil, err
	}
	n := &Network{CA: ca, Links: links}
	if n.emu, err = emulate(set, links); err != nil {
		return nil, err
	}
	for _, l := range links {
		log.Info("link emulated", "between", l.A+","+l.B, "rtt", l.RTT)
	}
	// Relays that others dial start first: a relay started before its
	// peers found nothing at their ports (through an emulated link's proxy,
	// a connection reset) and warned of it in the demo's first lines.
	// n.Relays keeps the order of the manifests.
	started := make([]*relay.Relay, len(set.Relays))
	for _, i := range dialedFirst(set) {
		rn := set.Relays[i]
		id, err := ca.Identity(rn.Name)
		if err != nil {
			n.Close()
			return nil, err
		}
		c := base
		c.Name, c.Manifests, c.Identity, c.Route = rn.Name, set, id, true
		if eps := n.emu.endpoints[rn.Name]; len(eps) > 0 {
			// This relay dials the peers of its emulated links through
			// their proxies; status and every other relay still see the
			// endpoints of the files.
			c.Manifests = set.WithEndpoints(eps)
		}
		r, err := relay.New(c)
		if err == nil {
			err = r.Start()
		}
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("relay %q: %w", rn.Name, err)
		}
		started[i] = r
		n.Relays = append(n.Relays, r)
	}
	n.Relays = started
	for _, c := range set.Chains {
		if c.Spec.Mode.Routed() {
			log.Info("chain routed by measurement", "chain", manifest.Key(c.Namespace, c.Name), "mode", c.Spec.Mode,
				"entry", c.Spec.Entry, "via", c.Spec.Via, "exit", c.Spec.Exit, "interval", routectl.Interval(c))
			continue
		}
		log.Info("chain route", "chain", manifest.Key(c.Namespace, c.Name), "mode", c.Spec.Mode,
			"route", logs.Route(manifest.Route(c)))
	}
	return n, nil
}

// dialedFirst orders the relays of set (indexes into set.Relays) so that
// each comes after the relays it dials (set.NextHops), where the chains
// allow: depth first, a relay after its next hops; a cycle is broken where
// it is met. Relays that dial none keep the manifests' order.
func dialedFirst(set *manifest.Set) []int {
	index := map[string]int{}
	for i, rn := range set.Relays {
		index[rn.Name] = i
	}
	seen := make([]bool, len(set.Relays))
	var order []int
	var visit func(i int)
	visit = func(i int) {
		if seen[i] {
			return
		}
		seen[i] = true
		for _, peer := range set.NextHops(set.Relays[i].Name) {
			if j, ok := index[peer]; ok {
				visit(j)
			}
		}
		order = append(order, i)
	}
	for i := range set.Relays {
		visit(i)
	}
	return order
}

// Ready reports whether every relay is ready.
func (n *Network) Ready() bool {
	for _, r := range n.Relays {
		if !r.Ready() {
			return false
		}
	}
	return len(n.Relays) > 0
}

// Drain drains every relay at once (see relay.Relay.Drain) until their
// open TCP flows end or ctx does, and returns how many were left open.
func (n *Network) Drain(ctx context.Context) int {
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, r := range n.Relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			open.Add(int64(r.Drain(ctx)))
		}()
	}
	wg.Wait()
	return int(open.Load())
}

// Close stops every relay, then the links' proxies.
func (n *Network) Close() error {
	err := closeAll(n.Relays)
	if n.emu != nil {
		err = errors.Join(err, n.emu.Close())
	}
	return err
}

// closeAll closes every relay at once. One after the other, each relay
// closed while the rest went on probing it, redialing it and handshaking
// new connections to it: with 34 relays on a busy host the process was
// still closing minutes after SIGTERM.
func closeAll[R interface{ Close() error }](relays []R) error {
	errs := make([]error, len(relays))
	var wg sync.WaitGroup
	for i, r := range relays {
		wg.Go(func() { errs[i] = r.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}
