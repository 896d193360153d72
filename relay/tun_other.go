//go:build !linux

package relay

import (
	"errors"
	"net/netip"
	"sync"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/nexthop"
)

var errNoTUN = errors.New("protocol tun needs a Linux relay")

type tunFlows struct {
	*env
	tcp       *tcpFlows
	udp       *udpFlows
	noOffload bool
}

func (f *tunFlows) open(*v1alpha1.Tunnel, string, netip.Prefix, []netip.Prefix) (func(), error) {
	return nil, errNoTUN
}

type packetTunnels struct {
	*env
	hops      *nexthop.Hops
	routes    *routeBook
	noOffload bool

	mu    sync.Mutex
	exits map[string]*packetExit
}

type packetExit struct{}

func (p *packetTunnels) openEntry(*v1alpha1.Tunnel, string, netip.Prefix, []netip.Prefix) (func(), error) {
	return nil, errNoTUN
}
func (p *packetTunnels) exitFor(string) (*packetExit, error) { return nil, errNoTUN }
func (p *packetTunnels) serve(*nexthop.Hop, *packetExit)     {}
func (p *packetTunnels) sync(*manifest.Set)                  {}
func (p *packetTunnels) close()                              {}
