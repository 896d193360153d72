package relay

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// ICMP echo through a flow-mode tun Tunnel. The entry's stack answers no
// ping itself: each (source, destination, identifier) of the pings it reads
// is an echo session to the exit (hop.KindEcho), which pings the
// destination from a socket of its own and sends back what it answers. The
// entry writes an echo reply into its device for those alone, so a ping
// says what it says everywhere else: the host answers.

// Bounds of echo sessions.
const (
	// maxEchoSessions bounds a Tunnel's echo sessions, at its entry and
	// at its exit: one per ping running, so a few suffice.
	maxEchoSessions = 256
	// echoIdle ends a session no request came on for this long (ping
	// sends one a second).
	echoIdle = 10 * time.Second
	// echoTimeout is how long a request waits for its reply; a later one
	// is not passed on.
	echoTimeout = 10 * time.Second
	// maxOutstanding bounds the requests a session waits on.
	maxOutstanding = 64
	// echoQueue bounds the requests a session at the entry holds while it
	// opens, or while its hop is slow.
	echoQueue = 16
)

// echoWait is a session's table of requests waiting for their reply, by
// sequence number: a reply is passed on once, and only to a request sent
// within echoTimeout.
type echoWait struct {
	mu   sync.Mutex
	sent map[uint16]time.Time
}

func (w *echoWait) add(seq uint16) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.sent == nil {
		w.sent = map[uint16]time.Time{}
	}
	if len(w.sent) >= maxOutstanding {
		oldest, at := uint16(0), now
		for s, t := range w.sent {
			if now.Sub(t) > echoTimeout {
				delete(w.sent, s)
			} else if t.Before(at) {
				oldest, at = s, t
			}
		}
		if len(w.sent) >= maxOutstanding {
			delete(w.sent, oldest)
		}
	}
	w.sent[seq] = now
}

// take says whether seq's request waits for a reply, and stops waiting.
func (w *echoWait) take(seq uint16) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.sent[seq]
	delete(w.sent, seq)
	return ok && time.Since(t) <= echoTimeout
}

// echoTypes are an address family's ICMP protocol number and echo types.
func echoTypes(v6 bool) (proto int, request, reply icmp.Type) {
	if v6 {
		return 58, ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	return 1, ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
}

// marshalEcho encodes an echo message as it crosses the chain. The ICMPv6
// checksum is left zero: no one checks it there, and the kernel computes
// it on every socket that sends one.
func marshalEcho(typ icmp.Type, id int, seq uint16, data []byte) []byte {
	b, _ := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: int(seq), Data: data}}).Marshal(nil)
	return b
}

// unreachable says, for an error sending to a destination, the code of the
// ICMP or ICMPv6 destination unreachable a router would send: the exit
// has no route. Other errors, and a ping that times out, are silent.
func unreachable(err error, v6 bool) (code uint8, ok bool) {
	switch {
	case errors.Is(err, syscall.ENETUNREACH):
		return 0, true // v4 net unreachable, v6 no route
	case errors.Is(err, syscall.EHOSTUNREACH) && v6:
		return 3, true // address unreachable
	case errors.Is(err, syscall.EHOSTUNREACH):
		return 1, true // host unreachable
	}
	return 0, false
}

// unreachableType is the family's destination unreachable.
func unreachableType(v6 bool) icmp.Type {
	if v6 {
		return ipv6.ICMPTypeDestinationUnreachable
	}
	return ipv4.ICMPTypeDestinationUnreachable
}

// marshalUnreachable encodes, to cross the chain back, a destination
// unreachable about the echo request of seq.
func marshalUnreachable(v6 bool, code uint8, req icmp.Type, seq uint16, data []byte) []byte {
	b, _ := (&icmp.Message{Type: unreachableType(v6), Code: int(code), Body: &icmp.DstUnreach{Data: marshalEcho(req, 0, seq, data)}}).Marshal(nil)
	return b
}

// parseUnreachable decodes a destination unreachable about an echo
// request of the family: its code, and the request's sequence number and
// data.
func parseUnreachable(v6 bool, b []byte) (code uint8, e *icmp.Echo, ok bool) {
	proto, req, _ := echoTypes(v6)
	m, err := icmp.ParseMessage(proto, b)
	if err != nil || m.Type != unreachableType(v6) || m.Code < 0 || m.Code > 255 {
		return 0, nil, false
	}
	d, ok := m.Body.(*icmp.DstUnreach)
	if !ok {
		return 0, nil, false
	}
	e, ok = parseEcho(proto, req, d.Data)
	return uint8(m.Code), e, ok
}

// parseEcho decodes an echo message of type typ; false for anything else.
func parseEcho(proto int, typ icmp.Type, b []byte) (*icmp.Echo, bool) {
	m, err := icmp.ParseMessage(proto, b)
	if err != nil || m.Type != typ || m.Code != 0 {
		return nil, false
	}
	e, ok := m.Body.(*icmp.Echo)
	return e, ok
}

// pinger pings one destination from a socket of its own: an unprivileged
// ICMP socket where net.ipv4.ping_group_range holds the relay's group
// (the kernel then gives the socket its own identifier and hands it only
// its replies), else a raw one where the relay has CAP_NET_RAW (which
// sees every echo reply, so the pinger picks an identifier and keeps to
// it).
type pinger struct {
	c        *icmp.PacketConn
	dst      netip.Addr
	to       net.Addr
	raw      bool
	id       int
	proto    int
	req, rep icmp.Type
	wait     echoWait
}

// openPinger opens a pinger for dst; its error says what the relay lacks.
func openPinger(dst netip.Addr) (*pinger, error) {
	dst = dst.Unmap()
	p := &pinger{dst: dst}
	p.proto, p.req, p.rep = echoTypes(dst.Is6())
	network, rawNetwork, laddr := "udp4", "ip4:icmp", "0.0.0.0"
	if dst.Is6() {
		network, rawNetwork, laddr = "udp6", "ip6:ipv6-icmp", "::"
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err == nil {
		p.c, p.to = c, &net.UDPAddr{IP: dst.AsSlice()}
		return p, nil
	}
	c, rerr := icmp.ListenPacket(rawNetwork, laddr)
	if rerr != nil {
		return nil, fmt.Errorf("no ICMP socket: unprivileged: %v (net.ipv4.ping_group_range must hold the relay's group); raw: %v (needs CAP_NET_RAW)", err, rerr)
	}
	p.c, p.to, p.raw, p.id = c, &net.IPAddr{IP: dst.AsSlice()}, true, 1+rand.IntN(0xffff)
	return p, nil
}

func (p *pinger) close() { p.c.Close() }

// send sends an echo request.
func (p *pinger) send(seq uint16, data []byte) error {
	p.wait.add(seq)
	_, err := p.c.WriteTo(marshalEcho(p.req, p.id, seq, data), p.to)
	return err
}

// receive hands each reply to a request of this pinger to reply until the
// socket closes, or until its deadline passes when stop says so.
func (p *pinger) receive(reply func(seq uint16, data []byte), stop func() bool) {
	buf := make([]byte, hop.MaxFrame)
	for {
		p.c.SetReadDeadline(time.Now().Add(time.Second))
		n, from, err := p.c.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !stop() {
				continue
			}
			return
		}
		if addrOf(from) != p.dst {
			continue
		}
		e, ok := parseEcho(p.proto, p.rep, buf[:n])
		if !ok || p.raw && e.ID != p.id || !p.wait.take(uint16(e.Seq)) {
			continue
		}
		reply(uint16(e.Seq), e.Data)
	}
}

func addrOf(a net.Addr) netip.Addr {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.IPAddr:
		ip = a.IP
	}
	ad, _ := netip.AddrFromSlice(ip)
	return ad.Unmap()
}

// echoExit serves an echo session at a flow-mode Tunnel's exit: it pings
// the destination (admitted: inside the Tunnel's routes) and sends back
// its replies, until the entry ends the session or it idles.
func (f *udpFlows) echoExit(from *nexthop.Hop, h *hop.Header, t *v1alpha1.Tunnel) {
	back := from.Session(nexthop.SessionOptions{Share: queueShare(t, h.Tunnel)})
	if !f.echoes.take(f.ctx, h.Tunnel, maxEchoSessions, 0) {
		f.m.TUNDropped.WithLabelValues(f.name, h.Tunnel, "echo_limit").Inc()
		back.End(hop.CodeRejected)
		return
	}
	defer f.echoes.give(h.Tunnel)
	ap, err := netip.ParseAddrPort(h.Target)
	if err != nil {
		back.End(hop.CodeRejected)
		return
	}
	if err := f.egress.Check(ap.Addr()); err != nil {
		f.dialFailed(h.Tunnel, h.Target, err)
		back.End(hop.CodeDialFailed)
		return
	}
	p, err := openPinger(ap.Addr())
	if err != nil {
		// Nothing answers: the ping goes unanswered, as the host's would.
		f.m.TUNDropped.WithLabelValues(f.name, h.Tunnel, "no_icmp_socket").Inc()
		f.warn.Warn("cannot ping through a tun Tunnel", "tunnel", h.Tunnel, "target", ap.Addr(), "err", err)
		back.End(hop.CodeDialFailed)
		return
	}
	defer p.close()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	toDst := func(b []byte) {
		e, ok := parseEcho(p.proto, p.req, b)
		if !ok {
			f.m.TUNDropped.WithLabelValues(f.name, h.Tunnel, "malformed").Inc()
			return
		}
		last.Store(time.Now().UnixNano())
		if err := p.send(uint16(e.Seq), e.Data); err != nil {
			f.m.TUNDropped.WithLabelValues(f.name, h.Tunnel, "send_failed").Inc()
			// No route here: the sender hears so, as from a router.
			if code, ok := unreachable(err, p.dst.Is6()); ok && back.Send(marshalUnreachable(p.dst.Is6(), code, p.req, uint16(e.Seq), e.Data)) == nil {
				back.Flush()
			}
		}
	}
	back.Receive(toDst)
	var ended atomic.Bool
	go func() {
		back.ReadFrames(toDst, nil) // until the entry ends the session
		ended.Store(true)
	}()
	p.receive(func(seq uint16, data []byte) {
		if back.Send(marshalEcho(p.rep, 0, seq, data)) == nil {
			back.Flush()
		}
	}, func() bool {
		return ended.Load() || time.Since(time.Unix(0, last.Load())) > echoIdle
	})
	back.End(hop.CodeIdle)
}
