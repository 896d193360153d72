package relay

import (
	"net"
	"net/netip"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A Tunnel with spec.proxyProtocol has its exit tell the target each
// client's address: a PROXY protocol header first on each TCP connection,
// and (v2) first in each UDP datagram. The entry puts the client's address
// and the one it connected to in the hop header; without them (a flow from
// an entry that did not send them) the header says LOCAL (v2) or UNKNOWN
// (v1), so the target still finds the header it expects.

// proxyAddrs are a flow's client address and the address it connected to,
// for the hop header: empty unless the Tunnel asks for PROXY headers.
func proxyAddrs(t *v1alpha1.Tunnel, client, listener net.Addr) (string, string) {
	if t.Spec.ProxyProtocol == "" {
		return "", ""
	}
	c, l := addrPort(client), addrPort(listener)
	if !c.IsValid() || !l.IsValid() {
		return "", ""
	}
	return c.String(), l.String()
}

func addrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// proxyHeader is the PROXY header for a flow of t (nil when t asks for
// none), from the hop header's client and listener addresses.
func proxyHeader(t *v1alpha1.Tunnel, udp bool, client, listener string) []byte {
	version := byte(2)
	switch t.Spec.ProxyProtocol {
	case "":
		return nil
	case v1alpha1.ProxyV1:
		version = 1
	}
	var src, dst net.Addr
	c, cerr := netip.ParseAddrPort(client)
	l, lerr := netip.ParseAddrPort(listener)
	if cerr == nil && lerr == nil {
		if udp {
			src, dst = net.UDPAddrFromAddrPort(c), net.UDPAddrFromAddrPort(l)
		} else {
			src, dst = net.TCPAddrFromAddrPort(c), net.TCPAddrFromAddrPort(l)
		}
	}
	b, err := proxyproto.HeaderProxyFromAddrs(version, src, dst).Format()
	if err != nil {
		// Only addresses we parsed reach here; say LOCAL rather than fail.
		b, _ = proxyproto.HeaderProxyFromAddrs(version, nil, nil).Format()
	}
	return b
}
