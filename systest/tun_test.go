package systest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// The tun test runs three relays as processes in three namespaces joined by
// veth pairs, cl <-> mid <-> sv: the client's namespace holds the entry
// relay and its devices, mid a middle relay, sv the exit relay and the
// servers (on 10.77.N.1 and fd77:N::1). Seven tun Tunnels share the
// relays: flow mode over QUIC, packet mode over QUIC, packet mode over TLS,
// IPv6 flow and packet mode over QUIC, and a flow and a packet Tunnel that
// each route an IPv4 and an IPv6 subnet through one device (dual). Behind
// each route, .9 (::9) is an address where nothing answers; the flow
// Tunnels also route 10.76.1.0/24 and fd76:1::/64, to which sv has no route.
// A dual device holds its IPv4 address only: IPv6 leaves it from the
// client host's own address, fd30::1, which the packet Tunnel lists in its
// sources. The dual devices run at IPv6's least MTU, 1280.
const tunManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {endpoints: ["CL:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: mid}
spec: {endpoints: ["MID:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {endpoints: ["SV:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: cq}
spec: {entry: hk, exit: la, via: [mid], route: [hk, mid, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: ct}
spec: {entry: hk, exit: la, via: [mid], route: [hk, mid, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flow}
spec: {chain: cq, protocol: tun, tun: {name: hl-flow, address: 10.201.0.1/24, routes: [10.77.1.0/24, 10.76.1.0/24]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pktq}
spec: {chain: cq, protocol: tun, tun: {name: hl-pktq, address: 10.202.0.1/24, routes: [10.77.2.0/24], mode: packet}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pktt}
spec: {chain: ct, protocol: tun, tun: {name: hl-pktt, address: 10.203.0.1/24, routes: [10.77.3.0/24], mode: packet}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: flow6}
spec: {chain: cq, protocol: tun, tun: {name: hl-flow6, address: "fd20:1::1/64", routes: ["fd77:1::/64", "fd76:1::/64"]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: pkt6}
spec: {chain: cq, protocol: tun, tun: {name: hl-pkt6, address: "fd20:2::1/64", routes: ["fd77:2::/64"], mode: packet}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: dualf}
spec: {chain: cq, protocol: tun, tun: {name: hl-dualf, address: 10.204.0.1/24, mtu: 1280, routes: [10.77.4.0/24, "fd77:4::/64"]}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: dualp}
spec: {chain: cq, protocol: tun, tun: {name: hl-dualp, address: 10.205.0.1/24, mtu: 1280, routes: [10.77.5.0/24, "fd77:5::/64"], mode: packet, sources: [10.205.0.0/24, "fd30::/64"]}}
`

func TestTunTunnels(t *testing.T) {
	requireNetns(t)
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	tag := fmt.Sprintf("ht%d", os.Getpid()%100000)
	cl, mid, sv := newNetns(t, tag+"-cl"), newNetns(t, tag+"-mid"), newNetns(t, tag+"-sv")
	clAddr, midA := link(t, cl, mid, 1, "to-mid", "to-cl")
	midB, svAddr := link(t, mid, sv, 2, "to-sv", "to-mid")
	_ = midB
	// The servers' addresses, and a link the rest of each route leads to,
	// where nothing answers (a veth whose other end holds no address).
	procs.Run(t, "ip", "-n", sv.name, "link", "add", "void", "type", "veth", "peer", "name", "void-end")
	procs.Run(t, "ip", "-n", sv.name, "link", "set", "void", "up")
	procs.Run(t, "ip", "-n", sv.name, "link", "set", "void-end", "up")
	for _, i := range []int{1, 2, 3, 4, 5} {
		procs.Run(t, "ip", "-n", sv.name, "addr", "add", fmt.Sprintf("10.77.%d.1/32", i), "dev", "lo")
		procs.Run(t, "ip", "-n", sv.name, "route", "add", fmt.Sprintf("10.77.%d.0/24", i), "dev", "void")
	}
	for _, i := range []int{1, 2, 4, 5} {
		procs.Run(t, "ip", "-n", sv.name, "addr", "add", fmt.Sprintf("fd77:%d::1/128", i), "dev", "lo", "nodad")
		procs.Run(t, "ip", "-n", sv.name, "route", "add", fmt.Sprintf("fd77:%d::/64", i), "dev", "void")
	}
	// The client host's IPv6 address, as a dual-stack node has one.
	procs.Run(t, "ip", "-n", cl.name, "addr", "add", "fd30::1/128", "dev", "lo", "nodad")
	// The exit pings from an unprivileged ICMP socket, as a relay without
	// CAP_NET_RAW must (the relay's unit test covers the raw socket).
	procs.Run(t, "ip", "netns", "exec", sv.name, "sh", "-c", "echo 0 2147483647 > /proc/sys/net/ipv4/ping_group_range")
	m := strings.NewReplacer("CL", clAddr, "MID", midA, "SV", svAddr).Replace(tunManifests)
	certs := procs.RelayFiles(t, bin, dir, "tun.yaml", m, "hk", "mid", "la")

	// Servers in sv: a sink-then-source TCP server and a UDP echo, on every
	// address.
	// (UDP per address: a socket on 0.0.0.0 would answer packet-mode
	// clients from the exit device's address.)
	var tcpLn net.Listener
	sv.do(func() {
		var err error
		if tcpLn, err = net.Listen("tcp", ":5201"); err != nil {
			t.Fatal(err)
		}
		for _, a := range []string{"10.77.1.1", "10.77.2.1", "10.77.3.1", "10.77.4.1", "10.77.5.1", "[fd77:1::1]", "[fd77:2::1]", "[fd77:4::1]", "[fd77:5::1]"} {
			udpLn, err := net.ListenPacket("udp", a+":5353")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { udpLn.Close() })
			go func() {
				buf := make([]byte, 65535)
				for {
					n, from, err := udpLn.ReadFrom(buf)
					if err != nil {
						return
					}
					udpLn.WriteTo(buf[:n], from)
				}
			}()
		}
	})
	defer tcpLn.Close()
	go testutil.ServeSinkThenSource(tcpLn)

	relay := func(ns *netns, name string) *exec.Cmd {
		return ns.start(filepath.Join(dir, name+".log"), bin, "relay", "-f", dir, "--name", name,
			"--certs", certs, "--metrics-addr", "127.0.0.1:9464")
	}
	running := map[string]*exec.Cmd{"la": relay(sv, "la"), "mid": relay(mid, "mid"), "hk": relay(cl, "hk")}
	t.Cleanup(func() {
		if t.Failed() {
			nss := map[string]*netns{"la": sv, "mid": mid, "hk": cl}
			for name := range running {
				b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				t.Logf("%s log:\n%s", name, b)
				t.Logf("%s drops:\n%s", name, grepLines(metricsIn(t, nss[name]), "dropped", "hoplink_tun_packets"))
			}
		}
	})
	procs.Run(t, "ip", "netns", "exec", cl.name, "true")
	testutil.WaitFor(t, "devices up", func() error {
		for _, dev := range []string{"hl-flow", "hl-pktq", "hl-pktt", "hl-flow6", "hl-pkt6", "hl-dualf", "hl-dualp"} {
			if err := exec.Command("ip", "-n", cl.name, "link", "show", dev).Run(); err != nil {
				return fmt.Errorf("%s not up in the client namespace", dev)
			}
		}
		for _, dev := range []string{"hl-pktq", "hl-pktt", "hl-pkt6", "hl-dualp"} {
			if err := exec.Command("ip", "-n", sv.name, "link", "show", dev).Run(); err != nil {
				return fmt.Errorf("exit device %s not up", dev)
			}
		}
		return nil
	})

	// The dual rows cross the dual Tunnels' devices, both families on one
	// device, as src (the IPv6 rows from the host's own address). They move
	// 4 MiB to keep the test short: the 32 MiB rows proved volume already.
	for _, tc := range []struct {
		name, addr, silent, noRoute, src string
		size                             int64
	}{
		{"flow mode over QUIC", "10.77.1.1", "10.77.1.9", "10.76.1.1", "", 32 << 20},
		{"packet mode over QUIC", "10.77.2.1", "10.77.2.9", "", "", 32 << 20},
		{"packet mode over TLS", "10.77.3.1", "10.77.3.9", "", "", 32 << 20},
		{"IPv6 flow mode over QUIC", "fd77:1::1", "fd77:1::9", "fd76:1::1", "", 32 << 20},
		{"IPv6 packet mode over QUIC", "fd77:2::1", "fd77:2::9", "", "", 32 << 20},
		{"dual flow mode, IPv4", "10.77.4.1", "10.77.4.9", "", "", 4 << 20},
		{"dual flow mode, IPv6", "fd77:4::1", "fd77:4::9", "", "fd30::1", 4 << 20},
		{"dual packet mode, IPv4", "10.77.5.1", "10.77.5.9", "", "", 4 << 20},
		{"dual packet mode, IPv6", "fd77:5::1", "fd77:5::9", "", "fd30::1", 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hostPort := net.JoinHostPort(tc.addr, "5201")
			d := net.Dialer{Timeout: 3 * time.Second}
			if tc.src != "" {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(tc.src)}
			}
			dial := func() (net.Conn, error) {
				var c net.Conn
				var err error
				cl.do(func() { c, err = d.Dial("tcp", hostPort) })
				return c, err
			}
			testutil.WaitFor(t, "first flow", func() error { return testutil.TCPExchange(dial, 1<<10) })
			if err := testutil.TCPExchange(dial, tc.size); err != nil {
				t.Fatalf("%d MiB both ways: %v", tc.size>>20, err)
			}
			udpEchoFrom(t, cl, tc.src, net.JoinHostPort(tc.addr, "5353"), []int{10, 1200, 1400, 9000})
			// A ping is answered when its destination answers, and only
			// then: a Tunnel that answered for it would say a host is up
			// that is not.
			if got := pingFrom(t, cl, tc.src, tc.addr, 5); got != "reply" {
				t.Errorf("ping %s: %q; want an echo reply", tc.addr, got)
			}
			if got := pingFrom(t, cl, tc.src, tc.silent, 3); got != "" {
				t.Errorf("ping %s, where nothing answers: %q; want no answer", tc.silent, got)
			}
			// A ping larger than the device's MTU leaves the sender in
			// fragments. Packet mode carries them and the destination
			// answers; flow mode's exit cannot ping with them, and its
			// stack must not answer for the destination either.
			big := bytes.Repeat([]byte("hoplink!"), 375)
			if got := pingData(t, cl, tc.src, tc.silent, big, 1); got != "" {
				t.Errorf("3000-byte ping %s, where nothing answers: %q; want no answer", tc.silent, got)
			}
			if strings.Contains(tc.name, "packet mode") {
				if got := pingData(t, cl, tc.src, tc.addr, big, 3); got != "reply" {
					t.Errorf("3000-byte ping %s: %q; want an echo reply", tc.addr, got)
				}
			}
			// Where the exit has no route, the sender hears so at once.
			if tc.noRoute != "" {
				if got := ping(t, cl, tc.noRoute, 3); got != "unreachable" {
					t.Errorf("ping %s, which the exit has no route to: %q; want destination unreachable", tc.noRoute, got)
				}
			}
			// Both devices' headers are rebuilt from the packets they
			// come with; the kernel's own super-packets all pass.
			for _, ns := range []*netns{cl, sv} {
				if m := grepLines(metricsIn(t, ns), "bad_vnet_hdr"); m != "" {
					t.Errorf("sound packets dropped for their header:\n%s", m)
				}
			}
		})
	}

	t.Run("too big", func(t *testing.T) {
		// Nothing fragments on the way and nothing is dropped silently for
		// size: a sender whose packet does not fit hears how much does, by
		// ICMPv6 packet too big (IPv6's path MTU discovery) or, for IPv4
		// with DF, fragmentation needed. Two places can say so: the entry
		// host, for a packet a host behind it (lan) routes into a device
		// (MTU 1420, the dual ones 1280); and a router behind a packet-mode
		// exit, whose answer must come back through the Tunnel (sv, toward
		// a smaller link).
		lan := newNetns(t, tag+"-lan")
		link(t, cl, lan, 3, "to-lan", "to-cl")
		procs.Run(t, "ip", "-n", cl.name, "addr", "add", "fd31::1/64", "dev", "to-lan", "nodad")
		procs.Run(t, "ip", "-n", lan.name, "addr", "add", "fd31::2/64", "dev", "to-cl", "nodad")
		procs.Run(t, "ip", "-n", lan.name, "route", "add", "default", "via", "10.231.3.1")
		procs.Run(t, "ip", "-n", lan.name, "-6", "route", "add", "default", "via", "fd31::1")
		for _, ns := range []*netns{cl, sv} {
			procs.Run(t, "ip", "netns", "exec", ns.name, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
		}
		// (Below the 1280-byte dual device, only IPv4 can meet a smaller link.)
		for a, mtu := range map[string]string{"10.77.2.7/32": "1280", "fd77:2::7/128": "1280", "10.77.5.7/32": "1200"} {
			procs.Run(t, "ip", "-n", sv.name, "route", "add", a, "dev", "void", "mtu", mtu)
		}
		for _, c := range []struct {
			name    string
			ns      *netns
			dst     string
			size    int // the echo's data
			wantMTU int
		}{
			{"into the flow device", lan, "10.77.1.1", 1400, 1420},
			{"into the flow device, IPv6", lan, "fd77:1::1", 1400, 1420},
			{"into the packet device", lan, "10.77.2.1", 1400, 1420},
			{"into the packet device, IPv6", lan, "fd77:2::1", 1400, 1420},
			{"into the dual flow device at 1280, IPv6", lan, "fd77:4::1", 1300, 1280},
			{"into the dual packet device at 1280", lan, "10.77.5.1", 1300, 1280},
			{"behind the packet exit", cl, "10.77.2.7", 1300, 1280},
			{"behind the packet exit, IPv6", cl, "fd77:2::7", 1300, 1280},
			{"behind the dual packet exit", cl, "10.77.5.7", 1220, 1200},
		} {
			if got := tooBig(t, c.ns, c.dst, c.size, 3); got != c.wantMTU {
				t.Errorf("%s: a %d-byte echo to %s told MTU %d; want %d", c.name, c.size, c.dst, got, c.wantMTU)
			}
		}
	})

	t.Run("outside the routes", func(t *testing.T) {
		// Routed into the flow Tunnel's device by the kernel, but not one
		// of the Tunnel's routes: its stack refuses the connection.
		procs.Run(t, "ip", "-n", cl.name, "route", "add", "10.78.0.0/24", "dev", "hl-flow")
		var err error
		cl.do(func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", "10.78.0.1:5201", 3*time.Second); err == nil {
				c.Close()
			}
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect outside the routes: %v; want connection refused", err)
		}
		procs.Run(t, "ip", "-n", cl.name, "route", "add", "fd78::/64", "dev", "hl-flow6")
		cl.do(func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", "[fd78::1]:5201", 3*time.Second); err == nil {
				c.Close()
			}
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect outside the IPv6 routes: %v; want connection refused", err)
		}
		// And the packet Tunnel's entry drops what the kernel routed into
		// its device outside the Tunnel's prefixes.
		procs.Run(t, "ip", "-n", cl.name, "route", "add", "10.79.0.0/24", "dev", "hl-pktq")
		cl.do(func() {
			c, err := net.Dial("udp", "10.79.0.1:5353")
			if err == nil {
				c.Write([]byte("x"))
				c.Close()
			}
		})
		// The kernel's own IPv6 traffic on the device (router
		// solicitations, MLD) counts as not_routed too: the IPv6 drop
		// must add to what is there.
		pkt6Drops := `hoplink_tun_dropped_packets_total{reason="not_routed",relay="hk",tunnel="default/pkt6"}`
		before := metricValue(metricsIn(t, cl), pkt6Drops)
		procs.Run(t, "ip", "-n", cl.name, "route", "add", "fd79::/64", "dev", "hl-pkt6")
		cl.do(func() {
			c, err := net.Dial("udp", "[fd79::1]:5353")
			if err == nil {
				c.Write([]byte("x"))
				c.Close()
			}
		})
		testutil.WaitFor(t, "the drops counted", func() error {
			m := metricsIn(t, cl)
			if !strings.Contains(m, `hoplink_tun_dropped_packets_total{reason="not_routed",relay="hk",tunnel="default/pktq"}`) {
				return errors.New("no not_routed drop on hk")
			}
			if metricValue(m, pkt6Drops) <= before {
				return errors.New("no IPv6 not_routed drop on hk")
			}
			return nil
		})
	})

	t.Run("devices and routes gone after shutdown", func(t *testing.T) {
		for _, name := range []string{"hk", "la"} {
			p := running[name]
			p.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { done <- procs.Wait(p) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s exited with %v after SIGTERM", name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not exit within 10 s of SIGTERM", name)
			}
		}
		for ns, devs := range map[*netns][]string{cl: {"hl-flow", "hl-pktq", "hl-pktt", "hl-flow6", "hl-pkt6", "hl-dualf", "hl-dualp"}, sv: {"hl-pktq", "hl-pktt", "hl-pkt6", "hl-dualp"}} {
			out, _ := exec.Command("ip", "-n", ns.name, "link").CombinedOutput()
			for _, d := range devs {
				if strings.Contains(string(out), d) {
					t.Errorf("%s left in %s:\n%s", d, ns.name, out)
				}
			}
			routes, _ := exec.Command("ip", "-n", ns.name, "route").CombinedOutput()
			routes6, _ := exec.Command("ip", "-n", ns.name, "-6", "route").CombinedOutput()
			routes = append(routes, routes6...)
			if strings.Contains(string(routes), "10.77.") && ns == cl || strings.Contains(string(routes), "hl-") {
				t.Errorf("routes left in %s:\n%s", ns.name, routes)
			}
		}
	})
}

// grepLines keeps the lines of s holding any of words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// echoIntact sends a size-byte datagram on c, up to 5 times, and says
// whether one came back whole.
func echoIntact(c net.Conn, size int) bool {
	p := bytes.Repeat([]byte{byte(size)}, size)
	buf := make([]byte, 65535)
	for range 5 {
		c.Write(p)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err == nil && bytes.Equal(buf[:n], p) {
			return true
		}
	}
	return false
}

// udpEcho sends packets of the given sizes from ns and checks each echo.
func udpEcho(t *testing.T, ns *netns, addr string, sizes []int) {
	t.Helper()
	udpEchoFrom(t, ns, "", addr, sizes)
}

// udpEchoFrom is udpEcho from the address src ("": the kernel's choice).
func udpEchoFrom(t *testing.T, ns *netns, src, addr string, sizes []int) {
	t.Helper()
	var c net.Conn
	ns.do(func() {
		var err error
		d := net.Dialer{}
		if src != "" {
			d.LocalAddr = &net.UDPAddr{IP: net.ParseIP(src)}
		}
		if c, err = d.Dial("udp", addr); err != nil {
			t.Fatal(err)
		}
	})
	defer c.Close()
	for _, size := range sizes {
		if !echoIntact(c, size) {
			t.Errorf("UDP to %s: no intact echo of a %d-byte packet", addr, size)
		}
	}
}

// pingAnswered says whether addr answers a ping from ns (ping, "reply").
func pingAnswered(t *testing.T, ns *netns, addr string, tries int) bool {
	t.Helper()
	return ping(t, ns, addr, tries) == "reply"
}

// ping sends up to tries ICMP or ICMPv6 echo requests from ns to addr, a
// second apart, and returns the first answer from addr about them: "reply"
// (an echo reply), "unreachable" (a destination unreachable quoting the
// request), or "" (none).
func ping(t *testing.T, ns *netns, addr string, tries int) string {
	t.Helper()
	return pingFrom(t, ns, "", addr, tries)
}

// pingFrom is ping from the address src ("": the kernel's choice).
func pingFrom(t *testing.T, ns *netns, src, addr string, tries int) string {
	t.Helper()
	return pingData(t, ns, src, addr, []byte("hoplink"), tries)
}

// pingData is pingFrom with data in the requests.
func pingData(t *testing.T, ns *netns, src, addr string, data []byte, tries int) string {
	t.Helper()
	dst := net.ParseIP(addr)
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var req, rep, unreach icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply, ipv4.ICMPTypeDestinationUnreachable
	hl := 20 // the quoted request's IP header
	if dst.To4() == nil {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		req, rep, unreach = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, ipv6.ICMPTypeDestinationUnreachable
		hl = 40
	}
	if src != "" {
		laddr = src
	}
	var c *icmp.PacketConn
	ns.do(func() {
		var err error
		if c, err = icmp.ListenPacket(network, laddr); err != nil {
			t.Fatal(err)
		}
	})
	defer c.Close()
	id := os.Getpid() & 0xffff
	for seq := 1; seq <= tries; seq++ {
		msg := icmp.Message{Type: req, Body: &icmp.Echo{ID: id, Seq: seq, Data: data}}
		b, _ := msg.Marshal(nil) // the kernel sums ICMPv6
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || !from.(*net.IPAddr).IP.Equal(dst) {
				continue
			}
			switch m.Type {
			case rep:
				if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && bytes.Equal(e.Data, data) {
					return "reply"
				}
			case unreach:
				// The quote: the request's IP header, then its echo.
				if d, ok := m.Body.(*icmp.DstUnreach); ok && len(d.Data) >= hl+8 {
					if q, err := icmp.ParseMessage(proto, d.Data[hl:]); err == nil && q.Type == req {
						if e, ok := q.Body.(*icmp.Echo); ok && e.ID == id {
							return "unreachable"
						}
					}
				}
			}
		}
	}
	return ""
}

// tooBig sends up to tries echo requests of size bytes of data to addr
// from ns, with don't-fragment, and returns the MTU
// that the first packet too big (IPv6) or fragmentation needed (IPv4) about
// them tells, whichever router sent it; 0 if none came.
func tooBig(t *testing.T, ns *netns, addr string, size, tries int) int {
	t.Helper()
	dst := net.ParseIP(addr)
	v6 := dst.To4() == nil
	network, laddr, hl := "ip4:icmp", "0.0.0.0", 20
	req, want, code := byte(8), byte(3), byte(4)
	if v6 {
		network, laddr, hl = "ip6:ipv6-icmp", "::", 40
		req, want, code = 128, 2, 0
	}
	// Probe: don't fragment, and send whatever the sender's kernel learnt
	// of the path, so that every try reaches the router that objects.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
			}
		})
		return errors.Join(err, serr)
	}}
	var c net.PacketConn
	ns.do(func() {
		var err error
		if c, err = lc.ListenPacket(context.Background(), network, laddr); err != nil {
			t.Fatal(err)
		}
	})
	defer c.Close()
	id := (os.Getpid() + 1) & 0xffff
	for seq := 1; seq <= tries; seq++ {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: bytes.Repeat([]byte{'x'}, size)}}
		if v6 {
			msg.Type = ipv6.ICMPTypeEchoRequest
		}
		b, _ := msg.Marshal(nil)
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			t.Fatalf("send a %d-byte echo to %s: %v", size, addr, err)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			m := buf[:n] // the ICMP message: Go strips IPv4's header
			if len(m) < 8+hl+8 || m[0] != want || m[1] != code {
				continue
			}
			q := m[8+hl:] // the quoted echo request
			if q[0] != req || int(binary.BigEndian.Uint16(q[4:])) != id {
				continue
			}
			if v6 {
				return int(binary.BigEndian.Uint32(m[4:]))
			}
			return int(binary.BigEndian.Uint16(m[6:]))
		}
	}
	return 0
}

// metricValue is the value of one series in a /metrics page (0 if absent).
func metricValue(page, series string) float64 {
	for _, l := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// metricsIn reads the relay's /metrics inside a namespace.
func metricsIn(t *testing.T, ns *netns) string {
	t.Helper()
	var body []byte
	ns.do(func() {
		c, err := net.DialTimeout("tcp", "127.0.0.1:9464", 2*time.Second)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\n\r\n")
		body, _ = io.ReadAll(c)
	})
	return string(body)
}
