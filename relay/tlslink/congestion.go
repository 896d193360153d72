package tlslink

import (
	"net"
	"strings"
	"sync/atomic"
	"syscall"
)

// Congestion is the TCP congestion control a relay's TLS links run, and why.
type Congestion struct {
	// Want is what the RelayNode asks: auto, or an algorithm's name.
	Want string
	// Algorithm is what the relay's link sockets run.
	Algorithm string
	// Reason is why: auto (bbr, chosen), pinned (the one asked for),
	// not_allowed, not_available (the host's default runs instead), or
	// unsupported (the kernel cannot set it per socket).
	Reason string
	// Fix says what to do when Algorithm is not what was wanted.
	Fix string
}

// Reasons of a Congestion.
const (
	CongestionAuto         = "auto"
	CongestionPinned       = "pinned"
	CongestionNotAllowed   = "not_allowed"
	CongestionNotAvailable = "not_available"
	CongestionUnsupported  = "unsupported"
)

// preferred is what auto runs: it paces by the path's measured bandwidth
// and round trip instead of halving its rate at each loss, so a long leg
// that loses 1% of its packets keeps most of its rate.
const preferred = "bbr"

// ChooseCongestion decides, by trying it on a socket of its own, what the
// relay's link sockets run for want ("auto" or a name).
func ChooseCongestion(want string) Congestion {
	name := want
	if want == "" || want == "auto" {
		want, name = "auto", preferred
	}
	def, err := trySocketCongestion(name)
	c := Congestion{Want: want, Algorithm: name, Reason: CongestionPinned}
	if want == "auto" {
		c.Reason = CongestionAuto
	}
	switch {
	case err == nil:
		return c
	case err == syscall.EPERM:
		c.Reason = CongestionNotAllowed
		c.Fix = "the host lets unprivileged processes set only the algorithms in net.ipv4.tcp_allowed_congestion_control: add " + name +
			" there on the host (sysctl -w net.ipv4.tcp_allowed_congestion_control=\"reno cubic " + name + "\"; one list for every network namespace), or give the relay CAP_NET_ADMIN"
	case err == syscall.ENOENT:
		c.Reason = CongestionNotAvailable
		c.Fix = "the kernel has no " + name + " loaded: load it on the host (modprobe tcp_" + name + ", and list it in /etc/modules-load.d to keep it)"
	default:
		c.Reason = CongestionUnsupported
		c.Fix = "this kernel cannot set a socket's congestion control (" + err.Error() + ")"
	}
	c.Algorithm = def
	return c
}

// Wanted says whether the links run what was asked for.
func (c Congestion) Wanted() bool {
	return c.Reason == CongestionAuto || c.Reason == CongestionPinned
}

// ccSetting is the algorithm the relay's link sockets are given; "" leaves
// them the host's default, as where the relay could not have what it
// wanted.
type ccSetting struct{ v atomic.Pointer[string] }

func (s *ccSetting) store(c Congestion) {
	name := ""
	if c.Wanted() {
		name = c.Algorithm
	}
	s.v.Store(&name)
}

func (s *ccSetting) load() string {
	if p := s.v.Load(); p != nil {
		return *p
	}
	return ""
}

// notSentLowat is the most a link socket holds unsent before a write
// waits (TCP_NOTSENT_LOWAT; what is in flight is the congestion window's,
// and not bounded by it). The kernel grows a socket's buffer with its
// window, to 4 MiB, and wakes a blocked writer only once half of it
// drained: a flow's writes then came in lumps of megabytes, and what a
// relay wrote to a link in a quarter of a second said little of what the
// link carried, so a Tunnel's fair share (relay/fairshare.go) was set
// from noise, and a Tunnel's flows kept competing with what they had
// queued seconds before their cap. 512 KiB is 4 ms at 1 Gbit/s: time
// enough for the flow's copy to write again.
const notSentLowat = 512 << 10

// control sets the algorithm on a socket before it connects or listens
// (accepted connections inherit the listener's). A kernel that refuses
// what a probe socket took (a module unloaded since) leaves the host's
// default, which still carries the link: that is only said, not failed.
func (e *Endpoint) control(_, _ string, rc syscall.RawConn) error {
	rc.Control(func(fd uintptr) { setNotSentLowat(fd) })
	name := e.cc.load()
	if name == "" {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setSocketCongestion(fd, name) }); err != nil {
		return err
	}
	if serr != nil {
		e.warn.Warn("cannot set a link socket's congestion control", "algorithm", name, "err", serr)
	}
	return nil
}

// SetCongestion makes the links dialed and accepted from now on run c's
// algorithm; open ones keep theirs.
func (e *Endpoint) SetCongestion(c Congestion) {
	e.cc.store(c)
	rc, err := e.ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return
	}
	if c.Wanted() {
		e.control("", "", rc)
		return
	}
	// The listener may run what was wanted before: back to the default.
	if c.Algorithm != "" {
		rc.Control(func(fd uintptr) { setSocketCongestion(fd, c.Algorithm) })
	}
}

func trimNUL(s string) string { return strings.TrimRight(s, "\x00") }
