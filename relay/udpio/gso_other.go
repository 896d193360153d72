//go:build !linux

package udpio

import "net"

func gsoSupported(*net.UDPConn) bool { return false }

const gsoSpace = 0

func putGSO([]byte, int) {}
