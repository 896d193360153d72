package manifest

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Set is a validated collection of hoplink objects. Relay names are global
// (they are relay identities in certificates); Chains and Tunnels are keyed
// by namespace/name and refer to objects of their own namespace.
type Set struct {
	Relays  []*v1alpha1.RelayNode
	Chains  []*v1alpha1.Chain
	Tunnels []*v1alpha1.Tunnel
	// Skipped lists objects of other API groups that were read and ignored.
	Skipped []string
	// endpointsMayLack: the set comes from a cluster, where a relay's
	// endpoints are its running pods' addresses and none while no pod runs.
	// Such a relay is unreachable for now (a hop toward it fails, route
	// controllers avoid it), not a mistake in the objects; in files, a
	// missing endpoint is one.
	endpointsMayLack bool

	src     map[any]Source
	relays  map[string]*v1alpha1.RelayNode
	chains  map[string]*v1alpha1.Chain
	tunnels map[string]*v1alpha1.Tunnel
	// versions: other specs of Chains whose hops are admitted too (Version).
	versions map[string][]Version
	// replicas: of sidecar relays read from a cluster, their replicas
	// (SetReplicas).
	replicas map[string][]Replica
}

func newSet() *Set {
	return &Set{
		src:     map[any]Source{},
		relays:  map[string]*v1alpha1.RelayNode{},
		chains:  map[string]*v1alpha1.Chain{},
		tunnels: map[string]*v1alpha1.Tunnel{},
	}
}

// Key is the namespace/name of a namespaced object.
func Key(namespace, name string) string { return namespace + "/" + name }

func (s *Set) add(src Source, obj any) error {
	switch o := obj.(type) {
	case *v1alpha1.RelayNode:
		if o.Namespace == "" {
			o.Namespace = DefaultNamespace
		}
		o.Default()
		if prev, ok := s.relays[o.Name]; ok && o.Name != "" {
			return fmt.Errorf("%s: RelayNode %q: metadata.name: defined again (first in %s); relay names must be unique", src, o.Name, s.src[prev])
		}
		s.relays[o.Name] = o
		s.Relays = append(s.Relays, o)
	case *v1alpha1.Chain:
		if o.Namespace == "" {
			o.Namespace = DefaultNamespace
		}
		o.Default()
		k := Key(o.Namespace, o.Name)
		if prev, ok := s.chains[k]; ok && o.Name != "" {
			return fmt.Errorf("%s: Chain %q: metadata.name: defined again (first in %s)", src, k, s.src[prev])
		}
		s.chains[k] = o
		s.Chains = append(s.Chains, o)
	case *v1alpha1.Tunnel:
		if o.Namespace == "" {
			o.Namespace = DefaultNamespace
		}
		o.Default()
		k := Key(o.Namespace, o.Name)
		if prev, ok := s.tunnels[k]; ok && o.Name != "" {
			return fmt.Errorf("%s: Tunnel %q: metadata.name: defined again (first in %s)", src, k, s.src[prev])
		}
		s.tunnels[k] = o
		s.Tunnels = append(s.Tunnels, o)
	}
	s.src[obj] = src
	return nil
}

// Relay returns the RelayNode of that name, or nil.
func (s *Set) Relay(name string) *v1alpha1.RelayNode { return s.relays[name] }

// Chain returns the Chain with that namespace/name key, or nil.
func (s *Set) Chain(key string) *v1alpha1.Chain { return s.chains[key] }

// Tunnel returns the Tunnel with that namespace/name key, or nil.
func (s *Set) Tunnel(key string) *v1alpha1.Tunnel { return s.tunnels[key] }

// ChainOf returns the Chain a Tunnel rides.
func (s *Set) ChainOf(t *v1alpha1.Tunnel) *v1alpha1.Chain {
	return s.chains[Key(t.Namespace, t.Spec.Chain)]
}

// Source says where an object was read.
func (s *Set) Source(obj any) Source { return s.src[obj] }

// Route is the route new flows of a chain take: for a routed chain the
// route controller's choice in status, when the spec allows it, else
// spec.route. A static chain takes its spec.route alone: its status is
// only a copy, and whoever may write status must not steer its flows.
func Route(c *v1alpha1.Chain) []string {
	if c.Spec.Mode.Routed() && len(c.Status.Route) > 0 && ValidRoute(c, c.Status.Route) == nil {
		return c.Status.Route
	}
	return c.Spec.Route
}

// EntryTunnels lists the Tunnels whose listener opens on the named relay.
func (s *Set) EntryTunnels(relay string) []*v1alpha1.Tunnel {
	var out []*v1alpha1.Tunnel
	for _, t := range s.Tunnels {
		if c := s.ChainOf(t); c != nil && c.Spec.Entry == relay {
			out = append(out, t)
		}
	}
	return out
}

// NextHops lists the peers the named relay may forward to, i.e. the relays
// it keeps a connection to: the next hop on every static route, and every
// relay a routed chain may continue to from it.
func (s *Set) NextHops(relay string) []string {
	var out []string
	add := func(peers ...string) {
		for _, p := range peers {
			if p != relay && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	for _, c := range s.Chains {
		r := Route(c)
		if i := slices.Index(r, relay); i >= 0 && i+1 < len(r) {
			add(r[i+1])
		}
		if c.Spec.Mode.Routed() {
			add(NextHopsOf(c, relay)...)
		}
	}
	return out
}

// NextHopsOf lists the relays a flow of routed chain c may go to from relay:
// from the entry, the via relays and the exit; from a via relay, the other
// via relays and the exit (none when maxHops allows only entry -> exit).
func NextHopsOf(c *v1alpha1.Chain, relay string) []string {
	switch {
	case relay == c.Spec.Exit:
		return nil
	case relay == c.Spec.Entry && c.Spec.MaxHops == 1:
		return []string{c.Spec.Exit}
	case relay != c.Spec.Entry && (c.Spec.MaxHops == 1 || !slices.Contains(c.Spec.Via, relay)):
		return nil
	}
	var out []string
	for _, v := range c.Spec.Via {
		if v != relay {
			out = append(out, v)
		}
	}
	return append(out, c.Spec.Exit)
}

// Members lists the relays of a chain: entry, via relays, exit.
func Members(c *v1alpha1.Chain) []string {
	m := append([]string{c.Spec.Entry}, c.Spec.Via...)
	if c.Spec.Exit != c.Spec.Entry {
		m = append(m, c.Spec.Exit)
	}
	return m
}

// Measured lists the relays a route round asks for tables: the entry, the
// via relays (unless maxHops allows only entry -> exit) and the exit.
func Measured(c *v1alpha1.Chain) []string {
	out := []string{c.Spec.Entry}
	if c.Spec.MaxHops != 1 {
		out = append(out, c.Spec.Via...)
	}
	if c.Spec.Exit != c.Spec.Entry {
		out = append(out, c.Spec.Exit)
	}
	return out
}

// Receivers lists the relays that peers may send flows of chain c to, so
// that they must have endpoints.
func Receivers(c *v1alpha1.Chain) []string {
	if !c.Spec.Mode.Routed() {
		if r := Route(c); len(r) > 1 {
			return r[1:]
		}
		return nil
	}
	return NextHopsOf(c, c.Spec.Entry)
}

// AllowsHop reports whether a flow of chain c that reached relay self from
// peer prev (empty at the entry) may continue along rest, where rest starts
// with self and ends at the chain's exit. It is the check that keeps a relay
// from being steered anywhere a peer likes. A static chain allows its
// route; a routed chain allows any route its spec does (ValidRoute), so
// that flows opened on a route that was just replaced still finish on it,
// and no relay depends on learning a new route before the entry uses it.
func AllowsHop(c *v1alpha1.Chain, prev, self string, rest []string) bool {
	if len(rest) == 0 || rest[0] != self || rest[len(rest)-1] != c.Spec.Exit {
		return false
	}
	if c.Spec.Mode.Routed() {
		if prev == "" {
			return self == c.Spec.Entry && ValidRoute(c, rest) == nil
		}
		if slices.Contains(rest, prev) || (prev != c.Spec.Entry && !slices.Contains(c.Spec.Via, prev)) {
			return false
		}
		// The shortest route this suffix can be part of: entry, prev (when
		// it is a via relay), then rest.
		full := append([]string{c.Spec.Entry}, rest...)
		if prev != c.Spec.Entry {
			full = append([]string{c.Spec.Entry, prev}, rest...)
		}
		return ValidRoute(c, full) == nil
	}
	route := c.Spec.Route
	i := slices.Index(route, self)
	if i < 0 || !slices.Equal(route[i:], rest) {
		return false
	}
	return (i == 0 && prev == "") || (i > 0 && route[i-1] == prev)
}

// ValidRoute says why route is not one that routed chain c may take: it
// must start at the entry, end at the exit, cross only via relays, visit
// each relay once and have at most maxHops links.
func ValidRoute(c *v1alpha1.Chain, route []string) error {
	switch {
	case len(route) == 0:
		return fmt.Errorf("empty route")
	case route[0] != c.Spec.Entry:
		return fmt.Errorf("route %v does not start at the entry %q", route, c.Spec.Entry)
	case route[len(route)-1] != c.Spec.Exit:
		return fmt.Errorf("route %v does not end at the exit %q", route, c.Spec.Exit)
	case len(route)-1 > int(max(c.Spec.MaxHops, 1)):
		return fmt.Errorf("route %v has %d links; spec.maxHops allows %d", route, len(route)-1, c.Spec.MaxHops)
	}
	for i, r := range route {
		if slices.Index(route, r) != i {
			return fmt.Errorf("route %v visits %q twice", route, r)
		}
		if i > 0 && i < len(route)-1 && !slices.Contains(c.Spec.Via, r) {
			return fmt.Errorf("route %v crosses %q, which is not in spec.via", route, r)
		}
	}
	return nil
}

// AllowsPath reports whether a link request of routed chain c that reached
// relay self from peer prev may go on along rest (self first). Link requests
// reach relays the entry has no link to of its own through relays that do,
// so unlike flows they may end anywhere after the entry; the path must
// still be a part of some route the spec allows, maxHops included.
func AllowsPath(c *v1alpha1.Chain, prev, self string, rest []string) bool {
	if !c.Spec.Mode.Routed() || len(rest) == 0 || rest[0] != self || slices.Contains(rest, prev) {
		return false
	}
	if prev != c.Spec.Entry && !slices.Contains(c.Spec.Via, prev) {
		return false
	}
	for i, r := range rest {
		switch {
		case slices.Index(rest, r) != i: // twice
			return false
		case r == c.Spec.Exit && i != len(rest)-1: // past the exit
			return false
		case r != c.Spec.Exit && !slices.Contains(c.Spec.Via, r):
			return false
		}
	}
	// The shortest route the path can be part of: entry, prev (when it is
	// a via relay), rest, and the exit when rest does not end there.
	links := len(rest)
	if prev != c.Spec.Entry {
		links++
	}
	if rest[len(rest)-1] != c.Spec.Exit {
		links++
	}
	return links <= int(max(c.Spec.MaxHops, 1))
}

// TunReaches says whether a tun Tunnel reaches target, an IP address and
// port: whether one of its routes holds the address.
func TunReaches(t *v1alpha1.Tunnel, target string) bool {
	ap, err := netip.ParseAddrPort(target)
	if err != nil || t.Spec.TUN == nil {
		return false
	}
	return PrefixesHold(t.Spec.TUN.Routes, ap.Addr())
}

// PrefixesHold says whether one of the prefixes holds addr.
func PrefixesHold(prefixes []string, addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, r := range prefixes {
		if p, err := netip.ParsePrefix(r); err == nil && p.Contains(addr) {
			return true
		}
	}
	return false
}

// SetReplicas records the replicas of sidecar relays read from a cluster
// (Replicas), by relay name: their peers dial each replica at every
// endpoint it has.
func (s *Set) SetReplicas(replicas map[string][]Replica) { s.replicas = replicas }

// ReplicasOf are the replicas of a sidecar relay: those SetReplicas
// recorded, else (a relay of files) each of its endpoints one.
func (s *Set) ReplicasOf(relay string) []Replica {
	if r, ok := s.replicas[relay]; ok {
		return r
	}
	var out []Replica
	if rn := s.relays[relay]; rn != nil {
		for _, ep := range rn.Spec.Endpoints {
			out = append(out, Replica{Name: ep, Endpoints: []string{ep}})
		}
	}
	return out
}

// WithEndpoints returns a copy of s in which the named RelayNodes have
// other endpoints: what one relay of local mode dials when its links to
// them are emulated. Chains and Tunnels are shared with s.
func (s *Set) WithEndpoints(endpoints map[string][]string) *Set {
	c := *s
	c.src = maps.Clone(s.src)
	c.relays = maps.Clone(s.relays)
	c.Relays = slices.Clone(s.Relays)
	c.replicas = maps.Clone(s.replicas)
	for i, r := range c.Relays {
		eps, ok := endpoints[r.Name]
		if !ok {
			continue
		}
		delete(c.replicas, r.Name) // its replicas are these endpoints now
		cp := r.DeepCopy()
		cp.Spec.Endpoints = slices.Clone(eps)
		c.Relays[i], c.relays[r.Name] = cp, cp
		c.src[cp] = s.src[r]
	}
	return &c
}
