// Package egress is what an exit relay on a node's network may not reach
// for a Tunnel: the node itself. A host-network relay in a cluster dials
// its Tunnels' targets from the node's network namespace, where the node's
// loopback (the kubelet's and etcd's ports), its link-local addresses (the
// cloud's metadata service, with the node's credentials) and its own
// addresses are a connect away; a Tunnel's writer, a tenant of one
// namespace, must not get them by writing a target. The operator runs such
// relays with --refuse-node-egress unless the namespace is allowed the
// node's network (hoplink.dev/egress-host=true).
//
// The check is made on the address the socket connects to, after DNS
// resolution (net.Dialer's Control), so a name that resolves to the node
// is refused like the address. Services' cluster IPs are not the node's
// (a Service in front of a node's port is what the cluster publishes, and
// the Multi-Cluster Services exit dials them); with kube-proxy's IPVS mode
// they are on the node's kube-ipvs0 interface, whose addresses are not
// counted as the node's.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// AllowLabel is the namespace label that allows a namespace's Tunnels the
// node's network on host-network exits.
const AllowLabel = v1alpha1.LabelEgressHost

// Refused is the error of a target the policy refuses.
type Refused struct {
	Addr netip.Addr
	What string // "loopback", "link-local", ...
}

func (e *Refused) Error() string {
	return fmt.Sprintf("egress refused: %s is %s, which a host-network relay reaches only for namespaces labelled %s=true", e.Addr, e.What, AllowLabel)
}

// RouteRefused is the error of a TUN route over one of the node's.
type RouteRefused struct {
	Route, Node netip.Prefix
}

func (e *RouteRefused) Error() string {
	return fmt.Sprintf("egress refused: route %s overlaps the node's route to %s (its pods, other nodes' pods or its own network), which a host-network relay routes into a device only for namespaces labelled %s=true", e.Route, e.Node, AllowLabel)
}

// IsRefused says whether err is (or wraps) a refusal.
func IsRefused(err error) bool {
	var r *Refused
	var rr *RouteRefused
	return errors.As(err, &r) || errors.As(err, &rr)
}

// Addresses of cloud metadata services outside the link-local ranges.
var metadata = map[netip.Addr]string{
	netip.MustParseAddr("fd00:ec2::254"):   "a cloud metadata address",
	netip.MustParseAddr("100.100.100.200"): "a cloud metadata address",
}

var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
)

// ipvsInterface holds every Service's cluster IP under kube-proxy's IPVS
// mode: not the node's own.
const ipvsInterface = "kube-ipvs0"

// Policy refuses the node: loopback and unspecified addresses (which
// connect to loopback), link-local addresses and cloud metadata addresses,
// and the node's own addresses, read from its interfaces at most every
// ownEvery.
type Policy struct {
	// own lists the host's addresses; nil: net.Interfaces.
	own func() ([]netip.Addr, error)
	// routes lists the prefixes of the node's main routing table; nil:
	// netlink.
	routes func() ([]netip.Prefix, error)

	mu    sync.Mutex // one reader of the interfaces at a time
	addrs atomic.Pointer[ownAddrs]
}

type ownAddrs struct {
	m    map[netip.Addr]bool
	read time.Time
}

const ownEvery = 10 * time.Second

// NodePolicy refuses the node this process runs on.
func NodePolicy() *Policy { return &Policy{} }

// Check returns a *Refused for an address of the node, nil otherwise.
func (p *Policy) Check(a netip.Addr) error {
	if p == nil {
		return nil
	}
	a = a.Unmap()
	what := ""
	switch {
	case a.IsLoopback():
		what = "loopback"
	case a.IsUnspecified():
		what = "the unspecified address (the node's loopback)"
	case linkLocal4.Contains(a) || linkLocal6.Contains(a):
		what = "link-local (the cloud metadata service is there)"
	case metadata[a] != "":
		what = metadata[a]
	case p.ownAddrs()[a]:
		what = "an address of this relay's node"
	default:
		return nil
	}
	return &Refused{Addr: a, What: what}
}

// Control is for net.Dialer.Control: it refuses the connection before it
// is made, on the address it is made to.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("egress: %q: %w", address, err)
	}
	return p.Check(ap.Addr())
}

// Dialer is a dialer that checks every address it connects to (a nil
// Policy: any).
func (p *Policy) Dialer() *net.Dialer {
	if p == nil {
		return &net.Dialer{}
	}
	return &net.Dialer{Control: p.Control}
}

// ResolveUDP resolves target and checks its address.
func (p *Policy) ResolveUDP(target string) (*net.UDPAddr, error) {
	a, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, err
	}
	if ip, ok := netip.AddrFromSlice(a.IP); ok {
		if err := p.Check(ip); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// ownAddrs returns the node's addresses, read again when ownEvery has
// passed (an address a node gains later is refused within it).
func (p *Policy) ownAddrs() map[netip.Addr]bool {
	if o := p.addrs.Load(); o != nil && time.Since(o.read) < ownEvery {
		return o.m
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.addrs.Load()
	if o != nil && time.Since(o.read) < ownEvery {
		return o.m
	}
	own := p.own
	if own == nil {
		own = interfaceAddrs
	}
	addrs, err := own()
	if err != nil && o != nil {
		return o.m
	}
	next := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		next[a.Unmap().WithZone("")] = true
	}
	p.addrs.Store(&ownAddrs{m: next, read: time.Now()})
	return next
}

func interfaceAddrs() ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifc := range ifs {
		if ifc.Name == ipvsInterface {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					out = append(out, ip)
				}
			}
		}
	}
	return out, nil
}
