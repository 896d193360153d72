package tlslink

import (
	"net"

	"golang.org/x/sys/unix"
)

// trySocketCongestion tries name on a new TCP socket and returns the
// network namespace's default, which that socket started with.
func trySocketCongestion(name string) (def string, err error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return "", err
		}
	}
	defer unix.Close(fd)
	def, err = unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		return "", err
	}
	return trimNUL(def), setSocketCongestion(uintptr(fd), name)
}

func setSocketCongestion(fd uintptr, name string) error {
	return unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
}

// SocketCongestion is the algorithm c runs, or "" where the kernel does
// not say.
func SocketCongestion(c *net.TCPConn) string {
	rc, err := c.SyscallConn()
	if err != nil {
		return ""
	}
	var name string
	rc.Control(func(fd uintptr) {
		if s, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION); err == nil {
			name = trimNUL(s)
		}
	})
	return name
}

// setNotSentLowat bounds what a link socket holds that it has not sent
// yet (notSentLowat).
func setNotSentLowat(fd uintptr) error {
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, notSentLowat)
}
