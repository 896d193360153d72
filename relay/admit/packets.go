package admit

import (
	"fmt"
	"net/netip"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/tun"
)

// Reasons a packet of a packet-mode Tunnel is dropped: the reason label of
// hoplink_tun_dropped_packets_total.
const (
	NotIP      = "not_ip"
	NotRouted  = "not_routed"
	NotSource  = "not_source"
	packetPass = ""
)

// Packets checks the IP packets of a packet-mode tun Tunnel, at both ends
// of its session. Made once per Tunnel spec, so that no packet parses a
// prefix.
type Packets struct {
	entry   netip.Prefix // the entry device's address
	exit    netip.Prefix // the exit device's address
	routes  []netip.Prefix
	sources []netip.Prefix // the entry side's addresses, as the exit admits them
	// sourceRoutes are spec.tun.sources, which the exit routes back into
	// its device (the default, its own prefix, is routed there already).
	sourceRoutes []netip.Prefix
}

// NewPackets reads a Tunnel's packet rules from its spec.tun.
func NewPackets(t *v1alpha1.Tunnel) (*Packets, error) {
	u := t.Spec.TUN
	if u == nil {
		return nil, fmt.Errorf("Tunnel %s/%s has no spec.tun", t.Namespace, t.Name)
	}
	p := &Packets{}
	var err error
	if p.entry, err = netip.ParsePrefix(u.Address); err != nil {
		return nil, fmt.Errorf("spec.tun.address: %w", err)
	}
	p.exit = netip.PrefixFrom(p.entry.Addr().Next(), p.entry.Bits())
	if u.ExitAddress != "" {
		if p.exit, err = netip.ParsePrefix(u.ExitAddress); err != nil {
			return nil, fmt.Errorf("spec.tun.exitAddress: %w", err)
		}
	}
	if p.routes, err = prefixes(u.Routes, "spec.tun.routes"); err != nil {
		return nil, err
	}
	if p.sources, err = prefixes(u.Sources, "spec.tun.sources"); err != nil {
		return nil, err
	}
	for _, s := range p.sources {
		// The kernel routes the device's own prefix into it already; a
		// second route to it would fail the device's opening.
		if s.Masked() != p.exit.Masked() {
			p.sourceRoutes = append(p.sourceRoutes, s)
		}
	}
	if len(p.sources) == 0 {
		// By default the entry side is the device's prefix: the entry's
		// own address, and what the kernel routes into it from there.
		p.sources = []netip.Prefix{p.exit.Masked()}
	}
	return p, nil
}

func prefixes(ss []string, field string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// EntryAddress is the entry device's address with its prefix.
func (p *Packets) EntryAddress() netip.Prefix { return p.entry }

// ExitAddress is the exit device's address with its prefix.
func (p *Packets) ExitAddress() netip.Prefix { return p.exit }

// Routes are the networks the Tunnel reaches.
func (p *Packets) Routes() []netip.Prefix { return p.routes }

// Sources are the entry side's networks, as the exit admits them.
func (p *Packets) Sources() []netip.Prefix { return p.sources }

// SourceRoutes are the networks the exit routes back into its device.
func (p *Packets) SourceRoutes() []netip.Prefix { return p.sourceRoutes }

// IntoSession says whether a packet the entry read from its device may go
// into the session: the kernel routes only the Tunnel's routes and the
// device's prefix there, and nothing else is sent. It returns the drop
// reason, or "".
func (p *Packets) IntoSession(pkt []byte) string {
	_, dst, err := tun.Addresses(pkt)
	switch {
	case err != nil:
		return NotIP
	case !p.entry.Masked().Contains(dst) && !holds(p.routes, dst):
		return NotRouted
	}
	return packetPass
}

// IntoExit says whether a packet that came over the session may enter the
// exit's network: from the entry side, to a network the Tunnel reaches.
// The exit's own address takes pings alone: a client behind the entry must
// not reach the services the exit host runs (on a host-network exit, the
// node's kubelet and metrics). It returns the packet's source (invalid for
// an ICMP error, whose source is a router's), and the drop reason or "".
func (p *Packets) IntoExit(pkt []byte) (netip.Addr, string) {
	src, dst, err := tun.Addresses(pkt)
	switch {
	case err != nil:
		return src, NotIP
	case p.errorAbout(pkt, dst, p.routes, p.sources):
		// A router on the entry side tells a routed host of its reply.
		// Its source is the router's, outside the Tunnel's sources: no
		// address to learn a session by (an invalid one).
		return netip.Addr{}, packetPass
	case !holds(p.sources, src):
		return src, NotSource
	case holds(p.routes, dst):
	case dst == p.exit.Addr() && tun.IsEchoRequest(pkt):
	default:
		return src, NotRouted
	}
	return src, packetPass
}

// IntoEntry says whether a packet that came back over the session may
// enter the entry's network: from a network the Tunnel reaches (or the
// exit's own address, which answers pings), to the entry side. Whoever
// holds the exit's certificate, or relays its datagrams, can reach no
// other host behind the entry. It returns the drop reason, or "".
func (p *Packets) IntoEntry(pkt []byte) string {
	src, dst, err := tun.Addresses(pkt)
	switch {
	case err != nil:
		return NotIP
	case !holds(p.routes, src) && src != p.exit.Addr() && !p.errorAbout(pkt, dst, p.sources, p.routes):
		// Not from the routes, nor an error (unreachable, too big) a
		// router behind the exit sends about a packet the entry side sent.
		return NotRouted
	case !holds(p.sources, dst):
		return NotSource
	}
	return packetPass
}

// errorAbout says whether pkt, to dst, is an ICMP error about a packet dst
// sent from the from side to the to side: the router that sends one may
// have any address, and its errors (destination unreachable, packet too
// big for path MTU discovery) matter to the sender.
func (p *Packets) errorAbout(pkt []byte, dst netip.Addr, from, to []netip.Prefix) bool {
	isrc, idst, ok := tun.ICMPErrorAbout(pkt)
	return ok && isrc == dst && holds(from, isrc) && holds(to, idst)
}

func holds(ps []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
