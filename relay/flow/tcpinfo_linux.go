//go:build linux

package flow

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// onSocket runs fn on c's socket; false when c is closed already.
func onSocket(c *net.TCPConn, fn func(fd int)) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) }) == nil
}

// sinceReceived is how long ago c last received data (TCP_INFO), or 0
// when the kernel does not say.
func sinceReceived(c *net.TCPConn) time.Duration {
	var d time.Duration
	onSocket(c, func(fd int) {
		if info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			d = time.Duration(info.Last_data_recv) * time.Millisecond
		}
	})
	return d
}

// segments is what TCP_INFO says c sent and retransmitted, in segments.
func segments(c *net.TCPConn) (sent, retransmitted uint32) {
	onSocket(c, func(fd int) { sent, retransmitted = segmentsOf(fd) })
	return sent, retransmitted
}

// wasReset says whether c's peer reset it, or TCP gave up on it. Its
// state alone would not say: a socket whose both directions closed cleanly
// reads as CLOSE too, once it went to TIME_WAIT or through LAST_ACK. A
// reset (or a timeout) leaves its error on the socket, which SO_ERROR
// reads, and clears (TCPEnd.Broken keeps the answer).
func wasReset(c *net.TCPConn) bool {
	soErr := 0
	closed, ok := tcpState(c, func(fd int) {
		soErr, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	})
	return !ok || closed && soErr != 0
}

// inClose says whether c is in TCP's CLOSE state.
func inClose(c *net.TCPConn) bool {
	closed, ok := tcpState(c, nil)
	return ok && closed
}

// tcpState says whether c is in CLOSE, then runs then on its socket if it
// is; ok is false when c is closed already.
func tcpState(c *net.TCPConn, then func(fd int)) (closed, ok bool) {
	ok = onSocket(c, func(fd int) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		closed = err == nil && info.State == unix.BPF_TCP_CLOSE
		if closed && then != nil {
			then(fd)
		}
	})
	return closed && ok, ok
}

// segmentsOf is what TCP_INFO says the socket sent and retransmitted for
// want of a loss: retransmissions the receiver reported as duplicates
// (D-SACK) are not counted. Those are spurious, timers that fired before an
// acknowledgment came (on a busy host, a tail loss probe after a
// handshake's message waited for the peer's CPU), not packets the path
// lost.
func segmentsOf(fd int) (sent, retransmitted uint32) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || info == nil {
		return 0, 0
	}
	return info.Segs_out, info.Total_retrans - min(info.Dsack_dups, info.Total_retrans)
}
