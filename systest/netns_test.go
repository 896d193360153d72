package systest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
)

// The namespace test runs three relays as three processes, one per network
// namespace, joined by veth pairs: a client namespace (hk), a middle
// namespace (seattle) and a server namespace (la). hk cannot reach la
// directly, so traffic that arrives went through seattle.

type netns struct {
	t    *testing.T
	name string
}

func requireNetns(t *testing.T) {
	t.Helper()
	// CI runs as root and installs iproute2: there a skip would hide the test.
	if os.Geteuid() != 0 {
		gate.Missing(t, "network namespace test needs root (CAP_NET_ADMIN); run as root to include it")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		gate.Missing(t, "network namespace test needs the ip command (Debian package iproute2)")
	}
}

func newNetns(t *testing.T, name string) *netns {
	procs.Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	procs.Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return &netns{t: t, name: name}
}

// link joins two namespaces with a veth pair on a /30 of 10.231.N.0.
func link(t *testing.T, a, b *netns, n int, ifA, ifB string) (addrA, addrB string) {
	procs.Run(t, "ip", "link", "add", ifA, "netns", a.name, "type", "veth", "peer", "name", ifB, "netns", b.name)
	addrA, addrB = fmt.Sprintf("10.231.%d.1", n), fmt.Sprintf("10.231.%d.2", n)
	procs.Run(t, "ip", "-n", a.name, "addr", "add", addrA+"/30", "dev", ifA)
	procs.Run(t, "ip", "-n", b.name, "addr", "add", addrB+"/30", "dev", ifB)
	procs.Run(t, "ip", "-n", a.name, "link", "set", ifA, "up")
	procs.Run(t, "ip", "-n", b.name, "link", "set", ifB, "up")
	return addrA, addrB
}

// do runs f with the calling thread inside the namespace. Sockets made in f
// stay in the namespace after the thread returns to its own.
func (ns *netns) do(f func()) {
	ns.t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		ns.t.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join("/var/run/netns", ns.name))
	if err != nil {
		ns.t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		ns.t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			panic(err) // a thread stuck in the wrong namespace must not be reused
		}
	}()
	f()
}

// start runs a process inside the namespace; it is killed when the test ends.
func (ns *netns) start(logf string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.name}, args...)...)
	out, err := os.Create(logf)
	if err != nil {
		ns.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		ns.t.Fatal(err)
	}
	ns.t.Cleanup(func() {
		cmd.Process.Kill()
		procs.Wait(cmd)
		out.Close()
	})
	return cmd
}

// serve runs a TCP server on addr inside the namespace until the test ends.
func (ns *netns) serve(addr string, handle func(c *net.TCPConn)) {
	ns.t.Helper()
	ns.do(func() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			ns.t.Fatal(err)
		}
		ns.t.Cleanup(func() { ln.Close() })
		go testutil.Serve(ln, handle)
	})
}

const nsManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 7401}, endpoints: ["HK:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: seattle}
spec: {listen: {port: 7401}, endpoints: ["SEATTLE:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7401}, endpoints: ["LA:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: to-east}
spec: {entry: hk, exit: la, via: [seattle], route: [hk, seattle, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: bulk}
spec: {chain: to-east, listen: {address: 127.0.0.1, port: 15202}, target: "127.0.0.1:5201"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: dns}
spec: {chain: to-east, protocol: udp, listen: {address: 127.0.0.1, port: 15353}, target: "127.0.0.1:5353"}
`

func TestNamespaces(t *testing.T) {
	requireNetns(t)
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	tag := fmt.Sprintf("hl%d", os.Getpid()%100000)
	hk, sea, la := newNetns(t, tag+"-hk"), newNetns(t, tag+"-sea"), newNetns(t, tag+"-la")
	hkAddr, seaAddrA := link(t, hk, sea, 1, "to-sea", "to-hk")
	_, laAddr := link(t, sea, la, 2, "to-la", "to-sea")
	_ = hkAddr
	m := strings.NewReplacer("HK", hkAddr, "SEATTLE", seaAddrA, "LA", laAddr).Replace(nsManifests)
	certs := procs.RelayFiles(t, bin, dir, "chain.yaml", m, "hk", "seattle", "la")

	// Targets live in la's namespace, on its loopback: only la can reach them.
	var tcpTarget net.Listener
	var udpTarget net.PacketConn
	la.do(func() {
		var err error
		if tcpTarget, err = net.Listen("tcp", "127.0.0.1:5201"); err != nil {
			t.Fatal(err)
		}
		if udpTarget, err = net.ListenPacket("udp", "127.0.0.1:5353"); err != nil {
			t.Fatal(err)
		}
	})
	defer tcpTarget.Close()
	defer udpTarget.Close()
	go testutil.ServeSinkThenSource(tcpTarget)
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := udpTarget.ReadFrom(buf)
			if err != nil {
				return
			}
			udpTarget.WriteTo(buf[:n], from)
		}
	}()

	relay := func(ns *netns, name string) *exec.Cmd {
		return ns.start(filepath.Join(dir, name+".log"), bin, "relay", "-f", dir, "--name", name,
			"--certs", certs, "--metrics-addr", "127.0.0.1:9464", "--log-level", "debug")
	}
	running := map[string]*exec.Cmd{"la": relay(la, "la"), "seattle": relay(sea, "seattle"), "hk": relay(hk, "hk")}
	t.Cleanup(func() {
		if t.Failed() {
			for name := range running {
				b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				t.Logf("%s log:\n%s", name, b)
			}
		}
	})

	dial := func() (net.Conn, error) {
		var c net.Conn
		var err error
		hk.do(func() { c, err = net.DialTimeout("tcp", "127.0.0.1:15202", 2*time.Second) })
		return c, err
	}
	testutil.WaitFor(t, "chain up", func() error { return testutil.TCPExchange(dial, 1<<10) })

	t.Run("tcp 32 MiB both ways", func(t *testing.T) {
		if err := testutil.TCPExchange(dial, 32<<20); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("udp", func(t *testing.T) {
		var c net.Conn
		hk.do(func() {
			var err error
			if c, err = net.Dial("udp", "127.0.0.1:15353"); err != nil {
				t.Fatal(err)
			}
		})
		defer c.Close()
		for _, size := range []int{10, 1200, 9000} {
			if !echoIntact(c, size) {
				t.Fatalf("no intact echo of a %d-byte packet", size)
			}
		}
	})
	t.Run("middle relay restart", func(t *testing.T) {
		p := running["seattle"]
		p.Process.Kill()
		procs.Wait(p)
		if err := testutil.TCPExchange(dial, 1<<10); err == nil {
			t.Fatal("flow succeeded with the middle relay down")
		}
		running["seattle"] = relay(sea, "seattle")
		testutil.WaitFor(t, "recovery", func() error { return testutil.TCPExchange(dial, 1<<20) })
	})
	t.Run("metrics and clean shutdown", func(t *testing.T) {
		// The restarted seattle is up again for hk once hk's control link
		// reached it and a probe round heard it (flows recovered sooner,
		// over the TLS links).
		testutil.WaitFor(t, "hk counts seattle up", func() error {
			var body string
			var err error
			hk.do(func() {
				var c net.Conn
				if c, err = net.Dial("tcp", "127.0.0.1:9464"); err != nil {
					return
				}
				defer c.Close()
				fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\n\r\n")
				b, _ := io.ReadAll(c)
				body = string(b)
			})
			if err != nil {
				return err
			}
			if !strings.Contains(body, `hoplink_peer_up{peer="seattle",relay="hk"} 1`) {
				return fmt.Errorf("hk metrics lack peer_up 1 for seattle:\n%.2000s", body)
			}
			return nil
		})
		p := running["hk"]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- procs.Wait(p) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("hk exited with %v after SIGTERM", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("hk did not exit within 10 s of SIGTERM")
		}
	})
}
