//go:build linux

package netstack

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay/tun"
)

// The stack never answers a ping itself, in either family: a ping is the
// Echo handler's, which carries it to the exit. Pings larger than the
// device's MTU arrive in fragments the handler cannot read; the stack
// would put them together and answer for any address, so they go nowhere.
func TestStackNeverAnswersPings(t *testing.T) {
	node := testutil.Namespace(t, "ne")
	var dev *tun.Device
	if err := node.Do(func() (err error) {
		dev, err = tun.Open(tun.Config{Name: "hs0", Address: netip.MustParsePrefix("10.211.0.1/24"), MTU: 1420,
			Routes: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("fd88::/64")}, Offload: true, Stats: &tun.Stats{}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	echoes := make(chan tun.Echo, 16)
	st, err := New(Options{Device: dev, MTU: 1420, Allowed: func(netip.Addr) bool { return true },
		Echo: func(e tun.Echo) { echoes <- e },
		TCP:  func(conn *TCPConn, _ netip.AddrPort) { conn.Close() },
		UDP:  func(conn net.Conn, _, _ netip.AddrPort) { conn.Close() }})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Close()
		st.Close()
	})
	// The device holds an IPv4 address only: IPv6 leaves from the host's.
	if out, err := node.Command("ip", "addr", "add", "fd21::1/128", "dev", "lo", "nodad").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, c := range []struct {
		dst     string
		size    int
		handled bool // whole, so the Echo handler takes it
	}{
		{"10.88.0.9", 56, true},
		{"fd88::9", 56, true},
		{"10.88.0.9", 3000, false},
		{"fd88::9", 3000, false},
	} {
		network, laddr := "ip4:icmp", "0.0.0.0"
		var typ icmp.Type = ipv4.ICMPTypeEcho
		if netip.MustParseAddr(c.dst).Is6() {
			network, laddr, typ = "ip6:ipv6-icmp", "::", ipv6.ICMPTypeEchoRequest
		}
		var pc *icmp.PacketConn
		if err := node.Do(func() (err error) { pc, err = icmp.ListenPacket(network, laddr); return err }); err != nil {
			t.Fatal(err)
		}
		m := icmp.Message{Type: typ, Body: &icmp.Echo{ID: 7, Seq: 1, Data: bytes.Repeat([]byte("z"), c.size)}}
		b, _ := m.Marshal(nil)
		if _, err := pc.WriteTo(b, &net.IPAddr{IP: net.ParseIP(c.dst)}); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 9000)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				break
			}
			proto := 1
			if netip.MustParseAddr(c.dst).Is6() {
				proto = 58
			}
			if r, err := icmp.ParseMessage(proto, buf[:n]); err == nil && (r.Type == ipv4.ICMPTypeEchoReply || r.Type == ipv6.ICMPTypeEchoReply) {
				t.Errorf("%d bytes to %s: answered by %v, with nothing at the destination", c.size, c.dst, from)
			}
		}
		pc.Close()
		select {
		case e := <-echoes:
			if !c.handled || e.Dst.String() != c.dst || len(e.Data) != c.size {
				t.Errorf("%d bytes to %s: the handler took %v -> %v, %d bytes", c.size, c.dst, e.Src, e.Dst, len(e.Data))
			}
		default:
			if c.handled {
				t.Errorf("%d bytes to %s: the handler never took it", c.size, c.dst)
			}
		}
	}
}

// A ping behind IPv6 extension headers the stack walks (atomic fragment
// headers, which it skips; an experiment header) is the stack's to answer
// once it reaches it: it never may, for any address.
func TestStackNeverAnswersPingsBehindHeaders(t *testing.T) {
	node := testutil.Namespace(t, "nh")
	var dev *tun.Device
	if err := node.Do(func() (err error) {
		dev, err = tun.Open(tun.Config{Name: "hs0", Address: netip.MustParsePrefix("10.212.0.1/24"), MTU: 1420,
			Routes: []netip.Prefix{netip.MustParsePrefix("fd88::/64")}, Stats: &tun.Stats{}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st, err := New(Options{Device: dev, MTU: 1420, Allowed: func(netip.Addr) bool { return true },
		Echo: func(tun.Echo) {},
		TCP:  func(conn *TCPConn, _ netip.AddrPort) { conn.Close() },
		UDP:  func(conn net.Conn, _, _ netip.AddrPort) { conn.Close() }})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Close()
		st.Close()
	})
	if out, err := node.Command("ip", "addr", "add", "fd21::1/128", "dev", "lo", "nodad").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	src, dst := netip.MustParseAddr("fd21::1"), netip.MustParseAddr("fd88::9")
	atomic := func(next uint8) []byte { return []byte{next, 0, 0, 0, 0, 0, 0, 43} }
	for _, c := range []struct {
		name  string
		first uint8
		hdrs  [][]byte
	}{
		{"two atomic fragment headers", 44, [][]byte{atomic(44), atomic(58)}},
		{"an experiment header", 253, [][]byte{{58, 0, 0, 0, 0, 0, 0, 0}}},
	} {
		var pc *icmp.PacketConn
		if err := node.Do(func() (err error) { pc, err = icmp.ListenPacket("ip6:ipv6-icmp", "::"); return err }); err != nil {
			t.Fatal(err)
		}
		m := icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: 9, Seq: 1, Data: []byte("hidden")}}
		body, err := m.Marshal(icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice()))
		if err != nil {
			t.Fatal(err)
		}
		pkt := make([]byte, 40)
		pkt[0], pkt[6], pkt[7] = 0x60, c.first, 64
		copy(pkt[8:], src.AsSlice())
		copy(pkt[24:], dst.AsSlice())
		for _, h := range c.hdrs {
			pkt = append(pkt, h...)
		}
		pkt = append(pkt, body...)
		binary.BigEndian.PutUint16(pkt[4:], uint16(len(pkt)-40))
		if err := node.Do(func() error {
			fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
			if err != nil {
				return err
			}
			defer syscall.Close(fd)
			return syscall.Sendto(fd, pkt, 0, &syscall.SockaddrInet6{Addr: dst.As16()})
		}); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 9000)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				break
			}
			if r, err := icmp.ParseMessage(58, buf[:n]); err == nil && r.Type == ipv6.ICMPTypeEchoReply {
				t.Errorf("a ping behind %s: answered by %v, with nothing at the destination", c.name, from)
			}
		}
		pc.Close()
	}
}
