//go:build !linux

package quic

import "net"

// withGRO: GRO is Linux's; elsewhere quic-go reads as it always does.
func withGRO(c *lossyConn) net.PacketConn { return c }

// gsoSegment: without GSO every packet is sent alone.
func gsoSegment([]byte) int { return 0 }
