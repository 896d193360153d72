package egress

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// CheckRoutes refuses TUN routes that overlap a route the node already
// has in its main table, other than a default route: on a node those are
// its pods' and other nodes' pod ranges (the network plugin's routes), its
// own networks and whatever else the node reaches by a route of its own,
// which a route into a Tunnel's device would capture from every pod and
// process of the node. Services' cluster IPs are translated before routing
// and have no route: a TUN route over them captures nothing of theirs.
func (p *Policy) CheckRoutes(routes []netip.Prefix) error {
	if p == nil || len(routes) == 0 {
		return nil
	}
	have, err := p.nodeRoutes()
	if err != nil {
		return fmt.Errorf("egress: the node's routes: %w", err)
	}
	for _, r := range routes {
		for _, h := range have {
			if h.Bits() > 0 && r.Overlaps(h) {
				return &RouteRefused{Route: r, Node: h}
			}
		}
	}
	return nil
}

func (p *Policy) nodeRoutes() ([]netip.Prefix, error) {
	if p.routes != nil {
		return p.routes()
	}
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil {
			continue // a default route
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones).Masked())
	}
	return out, nil
}
