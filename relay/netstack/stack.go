//go:build linux

// Package netstack terminates the TCP and UDP flows that enter a tun
// Tunnel's device in gvisor's userspace TCP/IP stack, and hands each one to
// the relay as a connection with its original destination, as wireguard-go
// and Tailscale do. The stack is promiscuous: it answers for every address
// the device's routes send it, and only for those.
package netstack

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/hoplink/hoplink/relay/tun"
)

// Options configure a Stack.
type Options struct {
	// Device is the TUN device the stack attaches to, which counts its
	// packets and the stack's flows in its Stats. With offload (TCP
	// segmentation only), the link hands super-packets to the stack whole.
	Device *tun.Device
	MTU    int
	// Allowed says whether a destination is one the tunnel reaches (its
	// routes); flows to others are refused.
	Allowed func(netip.Addr) bool
	// TCP takes each new TCP connection, on its own goroutine, and owns it.
	// Abort resets it.
	TCP func(c *TCPConn, dst netip.AddrPort)
	// UDP takes each new UDP flow (a source and destination pair), on its
	// own goroutine, and owns it.
	UDP func(c net.Conn, src, dst netip.AddrPort)
	// Echo takes each ICMP or ICMPv6 echo request to an allowed
	// destination, on the device's read goroutine: it must not block. The
	// stack answers none itself; nil drops them.
	Echo func(tun.Echo)
	// MaxInFlight bounds TCP handshakes in progress.
	MaxInFlight int
}

// TCPConn is a terminated TCP flow.
type TCPConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
}

// Abort resets the connection, as a refused or failed flow must.
func (c *TCPConn) Abort() { c.ep.Abort() }

// Broken says whether the application reset the connection.
func (c *TCPConn) Broken() bool { return tcp.EndpointState(c.ep.State()) == tcp.StateError }

// Stack is a running stack on a device.
type Stack struct {
	s    *stack.Stack
	link *link
	wg   sync.WaitGroup
}

const nic = 1

// TCP buffer bounds. The stack's peers are applications on this host,
// microseconds away: a few hundred KiB keep a flow at line rate, and
// larger buffers only hold more of it in the relay's memory (8 MiB measured
// no faster, and 10-15 MB more resident).
const (
	tcpBufDefault = 256 << 10
	tcpBufMax     = 2 << 20
)

// CongestionControl is what the stack's TCP sends with, toward the
// clients on the device. Named, not left to gvisor's default, so that a
// benchmark or a reader can say what the client's leg runs. That leg is
// the entry's host itself (a round trip of microseconds, no loss but a
// full device queue), so it never bounds a flow: the long legs are the
// relays' links, whose congestion control the relay chooses (links'
// congestionControl).
const CongestionControl = "reno"

// New starts a stack on the device.
func New(o Options) (*Stack, error) {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1024
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	st := &Stack{s: s, link: newLink(o.Device, o.MTU, o.Allowed, o.Echo)}
	if err := setTCPOptions(s); err != nil {
		return nil, err
	}
	if err := s.CreateNIC(nic, st.link); err != nil {
		return nil, fmt.Errorf("create NIC: %v", err)
	}
	// Promiscuous and spoofing: the stack takes packets for any address
	// and answers from it, as the destination the client meant.
	s.SetPromiscuousMode(nic, true)
	s.SetSpoofing(nic, true)
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nic},
		{Destination: header.IPv6EmptySubnet, NIC: nic},
	})

	tcpFwd := tcp.NewForwarder(s, 0, o.MaxInFlight, func(r *tcp.ForwarderRequest) {
		id := r.ID()
		dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
		if !o.Allowed(dst.Addr()) {
			o.Device.Stats.Dropped("not_routed")
			r.Complete(true) // RST: this tunnel does not reach it
			return
		}
		var wq waiter.Queue
		ep, err := r.CreateEndpoint(&wq)
		if err != nil {
			r.Complete(true)
			return
		}
		r.Complete(false)
		ep.SocketOptions().SetKeepAlive(true)
		o.Device.Stats.Flowed("tcp")
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			o.TCP(&TCPConn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep}, dst)
		}()
	})
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)

	udpFwd := udp.NewForwarder(s, func(r *udp.ForwarderRequest) bool {
		id := r.ID()
		dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
		src := netip.AddrPortFrom(addrOf(id.RemoteAddress), id.RemotePort)
		if !o.Allowed(dst.Addr()) {
			o.Device.Stats.Dropped("not_routed")
			return true // handled: dropped
		}
		var wq waiter.Queue
		ep, err := r.CreateEndpoint(&wq)
		if err != nil {
			return true
		}
		o.Device.Stats.Flowed("udp")
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			o.UDP(gonet.NewUDPConn(&wq, ep), src, dst)
		}()
		return true
	})
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	st.link.start()
	return st, nil
}

// setTCPOptions sets what the stack's TCP runs with: SACK, the buffers'
// bounds with receive-buffer moderation, and the congestion control.
func setTCPOptions(s *stack.Stack) error {
	for _, opt := range []tcpip.SettableTransportProtocolOption{
		new(tcpip.TCPSACKEnabled),
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: tcpBufDefault, Max: tcpBufMax},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: tcpBufDefault, Max: tcpBufMax},
		new(tcpip.TCPModerateReceiveBufferOption),
		ptr(tcpip.CongestionControlOption(CongestionControl)),
	} {
		switch v := opt.(type) {
		case *tcpip.TCPSACKEnabled:
			*v = true
		case *tcpip.TCPModerateReceiveBufferOption:
			*v = true
		}
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fmt.Errorf("TCP option %T: %v", opt, err)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}

// Close stops the stack and waits for the flows' handlers. The link's read
// goroutine stops first: gvisor's Stack.Close waits for it (link.Wait)
// while holding locks that a packet on its way into the stack needs, so a
// packet in flight at that moment would hang both.
func (st *Stack) Close() {
	st.link.stopReading()
	st.s.Close()
	st.s.Wait()
	st.wg.Wait()
}
