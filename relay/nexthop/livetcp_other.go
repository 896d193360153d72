//go:build !linux

package nexthop

import "net"

// tcpSegments says nothing where the kernel has no TCP_INFO of this form.
func tcpSegments(*net.TCPConn) (sent, retransmitted uint32) { return 0, 0 }
