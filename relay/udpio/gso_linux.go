package udpio

import (
	"encoding/binary"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// gsoSupported says whether the kernel segments UDP sends on c
// (UDP_SEGMENT, Linux 4.18 and later).
func gsoSupported(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	rc.Control(func(fd uintptr) {
		_, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
		ok = err == nil
	})
	return ok
}

// gsoSpace is the room one UDP_SEGMENT control message takes.
var gsoSpace = unix.CmsgSpace(2)

// putGSO writes into oob (gsoSpace bytes) the control message that has the
// kernel cut a send into datagrams of size bytes.
func putGSO(oob []byte, size int) {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(size))
}
