package systest

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
)

// The attack tests run real relays in namespaces of their own and attack
// them as a tenant, a client or a relay's stolen certificate would; each
// asserts the defence, and a control that the attack's path is real.

// pairRelays are hk (in namespace cl) and la (in sv).
const pairRelays = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {endpoints: ["CL:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {endpoints: ["SV:7401"]}
---
`

// sitePair is a packet-mode Tunnel from hk (in cl) to la (in sv).
const sitePair = pairRelays + `
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: site}
spec: {chain: c, protocol: tun, tun: {name: hl-site, address: 10.210.0.1/24, routes: [10.77.9.0/24], mode: packet}}
`

type pair struct {
	cl, sv     *netns
	dir, certs string
	bin        string
	clA, svA   string
}

func newPair(t *testing.T, tag string) *pair {
	requireNetns(t)
	p := &pair{bin: procs.Hoplink(t), dir: t.TempDir()}
	name := fmt.Sprintf("%s%d", tag, os.Getpid()%100000)
	p.cl, p.sv = newNetns(t, name+"-cl"), newNetns(t, name+"-sv")
	p.clA, p.svA = link(t, p.cl, p.sv, 7, "to-sv", "to-cl")
	m := strings.NewReplacer("CL", p.clA, "SV", p.svA).Replace(sitePair)
	p.certs = procs.RelayFiles(t, p.bin, p.dir, "site.yaml", m, "hk", "la")
	return p
}

func (p *pair) relay(ns *netns, name string) {
	ns.start(filepath.Join(p.dir, name+".log"), p.bin, "relay", "-f", p.dir, "--name", name,
		"--certs", p.certs, "--metrics-addr", "127.0.0.1:9464")
	p.cl.t.Cleanup(func() {
		if p.cl.t.Failed() {
			b, _ := os.ReadFile(filepath.Join(p.dir, name+".log"))
			p.cl.t.Logf("%s log:\n%s", name, b)
		}
	})
}

// udpPacket is an IPv4 UDP packet (no UDP checksum, which IPv4 allows).
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(b[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(b[20:], src.Port())
	binary.BigEndian.PutUint16(b[22:], dst.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	copy(b[28:], payload)
	return b
}

// listenUDP opens a UDP socket in ns that reports what it receives.
func listenUDP(t *testing.T, ns *netns, addr string) <-chan string {
	t.Helper()
	var c net.PacketConn
	ns.do(func() {
		var err error
		if c, err = net.ListenPacket("udp", addr); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { c.Close() })
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	return got
}

// TestAttackEntryFromAFakeExit: whoever holds the exit's certificate (or
// relays its datagrams) sends packets back into the entry's network. The
// entry writes into its kernel only packets from the Tunnel's routes (or
// the exit's address) to its own side; one to any other host behind the
// entry (here 10.50.0.2) is dropped and counted.
func TestAttackEntryFromAFakeExit(t *testing.T) {
	p := newPair(t, "ha")
	procs.Run(t, "ip", "-n", p.cl.name, "addr", "add", "10.50.0.2/32", "dev", "lo")
	victim := listenUDP(t, p.cl, "10.50.0.2:9999")

	// The fake exit: la's own certificate, in la's place.
	id, err := pki.LoadIdentity("la", filepath.Join(p.certs, "ca.crt"), filepath.Join(p.certs, "la.crt"), filepath.Join(p.certs, "la.key"))
	if err != nil {
		t.Fatal(err)
	}
	var udp *net.UDPConn
	p.sv.do(func() {
		if udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(p.svA), Port: 7401}); err != nil {
			t.Fatal(err)
		}
	})
	tr := &quicgo.Transport{Conn: udp}
	defer tr.Close()
	ln, err := tr.Listen(id.ServerConfig(nil), &quicgo.Config{EnableDatagrams: true, MaxIdleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p.relay(p.cl, "hk")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The entry's control connection comes first; the session rides the
	// Tunnel's own connection.
	type session struct {
		conn *quicgo.Conn
		s    *quicgo.Stream
	}
	sessions := make(chan session, 1)
	go func() {
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				for {
					s, err := conn.AcceptStream(ctx)
					if err != nil {
						return
					}
					if h, err := hop.Read(s); err == nil && h.Kind == hop.KindPacket {
						sessions <- session{conn, s}
					}
				}
			}()
		}
	}()
	var conn *quicgo.Conn
	var s *quicgo.Stream
	select {
	case got := <-sessions:
		conn, s = got.conn, got.s
	case <-ctx.Done():
		t.Fatal("the entry never opened its packet session")
	}
	control := listenUDP(t, p.cl, "10.210.0.1:9998") // the device is up with its session
	exitAddr := netip.MustParseAddr("10.210.0.2")
	send := func(src, dst netip.AddrPort, payload string) {
		conn.SendDatagram(hop.AppendDatagram(nil, uint64(s.StreamID()), udpPacket(src, dst, []byte(payload))))
	}
	testutil.WaitFor(t, "a packet from the routes reaches the entry side", func() error {
		send(netip.AddrPortFrom(netip.MustParseAddr("10.77.9.1"), 53), netip.MustParseAddrPort("10.210.0.1:9998"), "allowed")
		select {
		case <-control:
			return nil
		case <-time.After(200 * time.Millisecond):
			return fmt.Errorf("nothing arrived")
		}
	})
	for range 20 {
		send(netip.AddrPortFrom(exitAddr, 4444), netip.MustParseAddrPort("10.50.0.2:9999"), "from the exit's address")
		send(netip.MustParseAddrPort("10.77.9.1:53"), netip.MustParseAddrPort("10.50.0.2:9999"), "from a route")
		send(netip.MustParseAddrPort("10.99.0.1:53"), netip.MustParseAddrPort("10.210.0.1:9998"), "from off the routes")
	}
	select {
	case got := <-victim:
		t.Fatalf("a host behind the entry received %q from the session", got)
	case got := <-control:
		t.Fatalf("the entry took %q from outside the Tunnel's routes", got)
	case <-time.After(time.Second):
	}
	metrics := metricsIn(t, p.cl)
	for _, reason := range []string{"not_source", "not_routed"} {
		if !strings.Contains(metrics, fmt.Sprintf(`hoplink_tun_dropped_packets_total{reason=%q,relay="hk",tunnel="default/site"}`, reason)) {
			t.Errorf("no %s drops counted:\n%s", reason, grepLines(metrics, "dropped"))
		}
	}
}

// TestAttackExitHostFromTheEntrySide: a client behind the entry tries the
// services the exit host runs on every address (here a TCP and a UDP
// server on 0.0.0.0), through the exit device's own address. Only pings
// get there.
func TestAttackExitHostFromTheEntrySide(t *testing.T) {
	p := newPair(t, "hx")
	procs.Run(t, "ip", "-n", p.sv.name, "addr", "add", "10.77.9.1/32", "dev", "lo")
	var tcpLn net.Listener
	p.sv.do(func() {
		var err error
		if tcpLn, err = net.Listen("tcp", "0.0.0.0:8080"); err != nil {
			t.Fatal(err)
		}
	})
	defer tcpLn.Close()
	go testutil.ServeSinkThenSource(tcpLn)
	host := listenUDP(t, p.sv, "0.0.0.0:9999")
	p.relay(p.sv, "la")
	p.relay(p.cl, "hk")

	dial := func(addr string) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			var c net.Conn
			var err error
			p.cl.do(func() { c, err = net.DialTimeout("tcp", addr, 2*time.Second) })
			return c, err
		}
	}
	// Control: the Tunnel's route works end to end.
	testutil.WaitFor(t, "the route carries a flow", func() error { return testutil.TCPExchange(dial("10.77.9.1:8080"), 1<<10) })
	if !pingAnswered(t, p.cl, "10.210.0.2", 5) {
		t.Error("no ICMP echo reply from the exit's own address")
	}

	if c, err := dial("10.210.0.2:8080")(); err == nil {
		c.Close()
		t.Fatal("a client behind the entry connected to the exit host's own service")
	}
	var u net.Conn
	p.cl.do(func() { u, _ = net.Dial("udp", "10.210.0.2:9999") })
	for range 10 {
		u.Write([]byte("knock"))
	}
	u.Close()
	select {
	case got := <-host:
		t.Fatalf("the exit host's UDP service received %q", got)
	case <-time.After(time.Second):
	}
	testutil.WaitFor(t, "the drops counted", func() error {
		if !strings.Contains(metricsIn(t, p.sv), `hoplink_tun_dropped_packets_total{reason="not_routed",relay="la",tunnel="default/site"}`) {
			return fmt.Errorf("no not_routed drops on la")
		}
		return nil
	})
}

// lossyPair has two TCP Tunnels from hk (in cl) to a server in sv, one
// over each transport.
const lossyPair = pairRelays + `
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: q}
spec: {entry: hk, exit: la, route: [hk, la], transport: quic}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: t}
spec: {entry: hk, exit: la, route: [hk, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: overquic}
spec: {chain: q, listen: {address: 127.0.0.1, port: 15301}, target: "SV:5201"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: overtls}
spec: {chain: t, listen: {address: 127.0.0.1, port: 15302}, target: "SV:5201"}
`

// TestSendErrorsAreLoss: the entry host's own firewall refuses 1% of the
// packets it sends to the exit (an nftables drop in the output hook, as a
// full conntrack table or a local rate limit would): sendmsg fails with
// EPERM. Flows over either transport slow down and finish byte-exact, and
// the QUIC connection between the relays lives on; the refused sends are
// counted as lost packets.
func TestSendErrorsAreLoss(t *testing.T) {
	requireNetns(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("this test needs nft (Debian package nftables)")
	}
	p := &pair{bin: procs.Hoplink(t), dir: t.TempDir()}
	name := fmt.Sprintf("hl%d", os.Getpid()%100000)
	p.cl, p.sv = newNetns(t, name+"-cl"), newNetns(t, name+"-sv")
	p.clA, p.svA = link(t, p.cl, p.sv, 8, "to-sv", "to-cl")
	// Segments as the wire has them, so that a drop is one packet.
	for _, ns := range []*netns{p.cl, p.sv} {
		exec.Command("ip", "netns", "exec", ns.name, "ethtool", "-K", map[*netns]string{p.cl: "to-sv", p.sv: "to-cl"}[ns], "tso", "off", "gso", "off", "gro", "off").Run()
	}
	m := strings.NewReplacer("CL", p.clA, "SV", p.svA).Replace(lossyPair)
	p.certs = procs.RelayFiles(t, p.bin, p.dir, "lossy.yaml", m, "hk", "la")
	var ln net.Listener
	p.sv.do(func() {
		var err error
		if ln, err = net.Listen("tcp", p.svA+":5201"); err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	go testutil.ServeSinkThenSource(ln)
	p.relay(p.sv, "la")
	p.relay(p.cl, "hk")
	dial := func(port int) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			var c net.Conn
			var err error
			p.cl.do(func() { c, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second) })
			return c, err
		}
	}
	testutil.WaitFor(t, "both tunnels carry a flow", func() error {
		if err := testutil.TCPExchange(dial(15301), 1<<10); err != nil {
			return err
		}
		return testutil.TCPExchange(dial(15302), 1<<10)
	})

	procs.Run(t, "ip", "netns", "exec", p.cl.name, "nft", "add table inet hl-loss")
	procs.Run(t, "ip", "netns", "exec", p.cl.name, "nft", "add chain inet hl-loss out { type filter hook output priority 0 ; }")
	procs.Run(t, "ip", "netns", "exec", p.cl.name, "nft", fmt.Sprintf("add rule inet hl-loss out ip daddr %s numgen random mod 100 < 1 drop", p.svA))
	for _, port := range []int{15301, 15302} {
		if err := testutil.TCPExchange(dial(port), 16<<20); err != nil {
			t.Fatalf("16 MiB both ways through port %d with 1%% of sends refused: %v", port, err)
		}
	}
	metrics := metricsIn(t, p.cl)
	if !strings.Contains(metrics, `hoplink_send_lost_packets_total{reason="eperm",relay="hk"}`) {
		t.Errorf("refused sends not counted:\n%s", grepLines(metrics, "send_lost"))
	}
	log, _ := os.ReadFile(filepath.Join(p.dir, "hk.log"))
	if strings.Contains(string(log), "connection lost") {
		t.Errorf("a QUIC connection between the relays died under the drops:\n%s", grepLines(string(log), "connection lost"))
	}
}
