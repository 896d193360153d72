package sockio

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP does a UDP socket's message sends and receives in raw system calls,
// as Conn does a stream's: quic-go's every packet passes here.
type UDP struct {
	rc    syscall.RawConn
	v6    bool // an AF_INET6 socket, which takes IPv4 addresses mapped
	laddr net.Addr

	smu    sync.Mutex
	s      msgOp
	sendFn func(fd uintptr) bool

	rmu    sync.Mutex
	r      msgOp
	recvFn func(fd uintptr) bool
}

// msgOp is the state of one send or receive under way.
type msgOp struct {
	b, oob         []byte
	sa             unix.RawSockaddrInet6 // big enough for either family
	salen          uint32
	n, oobn, flags int
	errno          syscall.Errno
}

// NewUDP makes the UDP of c; ok false when its socket cannot be had.
func NewUDP(c *net.UDPConn) (*UDP, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	domain := 0
	var serr error
	if err := rc.Control(func(fd uintptr) { domain, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN) }); err != nil || serr != nil {
		return nil, false
	}
	if domain != unix.AF_INET && domain != unix.AF_INET6 {
		return nil, false
	}
	u := &UDP{rc: rc, v6: domain == unix.AF_INET6, laddr: c.LocalAddr()}
	u.sendFn, u.recvFn = u.send, u.recv
	return u, true
}

// Sends says whether WriteMsg can send to addr: an address with a zone
// (a link-local one) is left to net, which names its interface.
func (u *UDP) Sends(addr netip.AddrPort) bool {
	a := addr.Addr()
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	return u.v6 || a.Unmap().Is4()
}

// WriteMsg sends b with control messages oob to addr (Sends says which it
// can), waiting on the poller while the socket is full.
func (u *UDP) WriteMsg(b, oob []byte, addr netip.AddrPort) (n, oobn int, err error) {
	u.smu.Lock()
	defer u.smu.Unlock()
	u.s = msgOp{b: b, oob: oob}
	u.s.salen = putSockaddr(&u.s.sa, addr, u.v6)
	rerr := u.rc.Write(u.sendFn)
	s := u.s
	u.s = msgOp{}
	switch {
	case rerr != nil:
		return 0, 0, &net.OpError{Op: "write", Net: "udp", Source: u.laddr, Addr: net.UDPAddrFromAddrPort(addr), Err: unwrapOp(rerr)}
	case s.errno != 0:
		return 0, 0, &net.OpError{Op: "write", Net: "udp", Source: u.laddr, Addr: net.UDPAddrFromAddrPort(addr), Err: syscallError("sendmsg", s.errno)}
	}
	return s.n, len(oob), nil
}

// ReadMsg receives one datagram (or a GRO run of them) into b and its
// control messages into oob, waiting on the poller while there is none.
func (u *UDP) ReadMsg(b, oob []byte) (n, oobn, flags int, from netip.AddrPort, err error) {
	u.rmu.Lock()
	defer u.rmu.Unlock()
	u.r = msgOp{b: b, oob: oob}
	rerr := u.rc.Read(u.recvFn)
	r := u.r
	u.r = msgOp{}
	switch {
	case rerr != nil:
		return 0, 0, 0, netip.AddrPort{}, &net.OpError{Op: "read", Net: "udp", Addr: u.laddr, Err: unwrapOp(rerr)}
	case r.errno != 0:
		return 0, 0, 0, netip.AddrPort{}, &net.OpError{Op: "read", Net: "udp", Addr: u.laddr, Err: syscallError("recvmsg", r.errno)}
	}
	return r.n, r.oobn, r.flags, getSockaddr(&r.sa, r.salen), nil
}

func (u *UDP) send(fd uintptr) bool {
	s := &u.s
	var iov unix.Iovec
	var msg unix.Msghdr
	if len(s.b) > 0 {
		iov.Base = &s.b[0]
		iov.SetLen(len(s.b))
		msg.Iov, msg.Iovlen = &iov, 1
	}
	if len(s.oob) > 0 {
		msg.Control = &s.oob[0]
		msg.SetControllen(len(s.oob))
	}
	msg.Name = (*byte)(unsafe.Pointer(&s.sa))
	msg.Namelen = s.salen
	for {
		n, _, e := unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.n = int(n)
		default:
			s.errno = e
		}
		return true
	}
}

func (u *UDP) recv(fd uintptr) bool {
	r := &u.r
	var iov unix.Iovec
	var msg unix.Msghdr
	if len(r.b) > 0 {
		iov.Base = &r.b[0]
		iov.SetLen(len(r.b))
		msg.Iov, msg.Iovlen = &iov, 1
	}
	if len(r.oob) > 0 {
		msg.Control = &r.oob[0]
		msg.SetControllen(len(r.oob))
	}
	msg.Name = (*byte)(unsafe.Pointer(&r.sa))
	msg.Namelen = uint32(unsafe.Sizeof(r.sa))
	for {
		n, _, e := unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			r.n, r.oobn, r.flags, r.salen = int(n), int(msg.Controllen), int(msg.Flags), msg.Namelen
		default:
			r.errno = e
		}
		return true
	}
}

// putSockaddr writes addr into sa for a socket of the family v6 says, and
// returns its length.
func putSockaddr(sa *unix.RawSockaddrInet6, addr netip.AddrPort, v6 bool) uint32 {
	port := addr.Port()
	if !v6 {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*s4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: addr.Addr().Unmap().As4()}
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: addr.Addr().As16()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	return unix.SizeofSockaddrInet6
}

// getSockaddr is the address recvmsg wrote into sa, as net's reads give
// it: an AF_INET6 socket's IPv4 peers mapped.
func getSockaddr(sa *unix.RawSockaddrInet6, n uint32) netip.AddrPort {
	switch {
	case sa.Family == unix.AF_INET && n >= unix.SizeofSockaddrInet4:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case sa.Family == unix.AF_INET6 && n >= unix.SizeofSockaddrInet6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		a := netip.AddrFrom16(sa.Addr)
		if sa.Scope_id != 0 {
			if ifi, err := net.InterfaceByIndex(int(sa.Scope_id)); err == nil {
				a = a.WithZone(ifi.Name)
			}
		}
		return netip.AddrPortFrom(a, uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}
