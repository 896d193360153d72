//go:build !linux

package sockio

import (
	"net"
	"net/netip"
	"syscall"
)

// Conn is Linux's only; New says so elsewhere, and callers use the
// connection itself.
type Conn struct{}

// New returns false: no raw calls here.
func New(interface {
	SyscallConn() (syscall.RawConn, error)
	LocalAddr() net.Addr
}) (*Conn, bool) {
	return nil, false
}

func (*Conn) Read([]byte) (int, error)    { panic("sockio: not on this system") }
func (*Conn) ReadNow([]byte) (int, error) { panic("sockio: not on this system") }
func (*Conn) Write([]byte) (int, error)   { panic("sockio: not on this system") }

// Read is read(2) on fd.
func Read(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), b)
	if e, ok := err.(syscall.Errno); ok {
		return 0, e
	}
	return max(n, 0), 0
}

// Write is write(2) on fd.
func Write(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), b)
	if e, ok := err.(syscall.Errno); ok {
		return 0, e
	}
	return max(n, 0), 0
}

// UDP is Linux's only; NewUDP says so elsewhere.
type UDP struct{}

// NewUDP returns false: no raw calls here.
func NewUDP(*net.UDPConn) (*UDP, bool) { return nil, false }

func (*UDP) Sends(netip.AddrPort) bool { return false }
func (*UDP) WriteMsg([]byte, []byte, netip.AddrPort) (int, int, error) {
	panic("sockio: not on this system")
}
func (*UDP) ReadMsg([]byte, []byte) (int, int, int, netip.AddrPort, error) {
	panic("sockio: not on this system")
}
