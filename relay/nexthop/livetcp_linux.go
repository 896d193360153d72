package nexthop

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpSegments is what c sent and retransmitted so far, from TCP_INFO.
func tcpSegments(c *net.TCPConn) (sent, retransmitted uint32) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0
	}
	var info *unix.TCPInfo
	if cerr := rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); cerr != nil || err != nil || info == nil {
		return 0, 0
	}
	return info.Segs_out, info.Total_retrans
}
