package systest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// The tun test runs three relays as processes in three namespaces joined by
// veth pairs, cl <-> mid <-> sv: the client's namespace holds the entry
// relay and its devices, mid a middle relay, sv the exit relay and the
// servers (on 10.77.1.1, 10.77.2.1, 10.77.3.1, fd77:1::1, fd77:2::1). Five
// tun Tunnels share the relays: flow mode over QUIC, packet mode over QUIC,
// packet mode over TLS, and IPv6 flow and packet mode over QUIC. Behind
// each route, .9 (::9) is an address where nothing answers; the flow
// Tunnels also route 10.76.1.0/24 and fd76:1::/64, to which sv has no route.
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
	for i := 1; i <= 3; i++ {
		procs.Run(t, "ip", "-n", sv.name, "addr", "add", fmt.Sprintf("10.77.%d.1/32", i), "dev", "lo")
		procs.Run(t, "ip", "-n", sv.name, "route", "add", fmt.Sprintf("10.77.%d.0/24", i), "dev", "void")
	}
	for i := 1; i <= 2; i++ {
		procs.Run(t, "ip", "-n", sv.name, "addr", "add", fmt.Sprintf("fd77:%d::1/128", i), "dev", "lo", "nodad")
		procs.Run(t, "ip", "-n", sv.name, "route", "add", fmt.Sprintf("fd77:%d::/64", i), "dev", "void")
	}
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
		for _, a := range []string{"10.77.1.1", "10.77.2.1", "10.77.3.1", "[fd77:1::1]", "[fd77:2::1]"} {
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
		for _, dev := range []string{"hl-flow", "hl-pktq", "hl-pktt", "hl-flow6", "hl-pkt6"} {
			if err := exec.Command("ip", "-n", cl.name, "link", "show", dev).Run(); err != nil {
				return fmt.Errorf("%s not up in the client namespace", dev)
			}
		}
		for _, dev := range []string{"hl-pktq", "hl-pktt", "hl-pkt6"} {
			if err := exec.Command("ip", "-n", sv.name, "link", "show", dev).Run(); err != nil {
				return fmt.Errorf("exit device %s not up", dev)
			}
		}
		return nil
	})

	for _, tc := range []struct{ name, addr, silent, noRoute string }{
		{"flow mode over QUIC", "10.77.1.1", "10.77.1.9", "10.76.1.1"},
		{"packet mode over QUIC", "10.77.2.1", "10.77.2.9", ""},
		{"packet mode over TLS", "10.77.3.1", "10.77.3.9", ""},
		{"IPv6 flow mode over QUIC", "fd77:1::1", "fd77:1::9", "fd76:1::1"},
		{"IPv6 packet mode over QUIC", "fd77:2::1", "fd77:2::9", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hostPort := net.JoinHostPort(tc.addr, "5201")
			dial := func() (net.Conn, error) {
				var c net.Conn
				var err error
				cl.do(func() { c, err = net.DialTimeout("tcp", hostPort, 3*time.Second) })
				return c, err
			}
			testutil.WaitFor(t, "first flow", func() error { return testutil.TCPExchange(dial, 1<<10) })
			if err := testutil.TCPExchange(dial, 32<<20); err != nil {
				t.Fatalf("32 MiB both ways: %v", err)
			}
			udpEcho(t, cl, net.JoinHostPort(tc.addr, "5353"), []int{10, 1200, 1400, 9000})
			// A ping is answered when its destination answers, and only
			// then: a Tunnel that answered for it would say a host is up
			// that is not.
			if got := ping(t, cl, tc.addr, 5); got != "reply" {
				t.Errorf("ping %s: %q; want an echo reply", tc.addr, got)
			}
			if got := ping(t, cl, tc.silent, 3); got != "" {
				t.Errorf("ping %s, where nothing answers: %q; want no answer", tc.silent, got)
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
		testutil.WaitFor(t, "the drop counted", func() error {
			if !strings.Contains(metricsIn(t, cl), `hoplink_tun_dropped_packets_total{reason="not_routed",relay="hk",tunnel="default/pktq"}`) {
				return errors.New("no not_routed drop on hk")
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
		for ns, devs := range map[*netns][]string{cl: {"hl-flow", "hl-pktq", "hl-pktt", "hl-flow6", "hl-pkt6"}, sv: {"hl-pktq", "hl-pktt", "hl-pkt6"}} {
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
	var c net.Conn
	ns.do(func() {
		var err error
		if c, err = net.Dial("udp", addr); err != nil {
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
	dst := net.ParseIP(addr)
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var req, rep, unreach icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply, ipv4.ICMPTypeDestinationUnreachable
	hl := 20 // the quoted request's IP header
	if dst.To4() == nil {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		req, rep, unreach = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, ipv6.ICMPTypeDestinationUnreachable
		hl = 40
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
		msg := icmp.Message{Type: req, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("hoplink")}}
		b, _ := msg.Marshal(nil) // the kernel sums ICMPv6
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 1500)
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
				if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && string(e.Data) == "hoplink" {
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
