package tlslink

import "golang.org/x/sys/unix"

// peerClosed says whether the peer of a TCP socket has closed its side
// (the socket is in CLOSE_WAIT, or further gone).
func peerClosed(fd uintptr) bool {
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err != nil || info.State != unix.BPF_TCP_ESTABLISHED
}
