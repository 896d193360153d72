package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/testing/testutil"
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
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal
	}
	if os.Geteuid() != 0 {
		skip("network namespace test needs root (CAP_NET_ADMIN); run as root to include it")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skip("network namespace test needs the ip command (Debian package iproute2)")
	}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func newNetns(t *testing.T, name string) *netns {
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return &netns{t: t, name: name}
}

// link joins two namespaces with a veth pair on a /30 of 10.231.N.0.
func link(t *testing.T, a, b *netns, n int, ifA, ifB string) (addrA, addrB string) {
	run(t, "ip", "link", "add", ifA, "netns", a.name, "type", "veth", "peer", "name", ifB, "netns", b.name)
	addrA, addrB = fmt.Sprintf("10.231.%d.1", n), fmt.Sprintf("10.231.%d.2", n)
	run(t, "ip", "-n", a.name, "addr", "add", addrA+"/30", "dev", ifA)
	run(t, "ip", "-n", b.name, "addr", "add", addrB+"/30", "dev", ifB)
	run(t, "ip", "-n", a.name, "link", "set", ifA, "up")
	run(t, "ip", "-n", b.name, "link", "set", ifB, "up")
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
		waitProc(cmd)
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

func buildHoplink(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hoplink")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
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
	bin := buildHoplink(t)
	dir := t.TempDir()
	tag := fmt.Sprintf("hl%d", os.Getpid()%100000)
	hk, sea, la := newNetns(t, tag+"-hk"), newNetns(t, tag+"-sea"), newNetns(t, tag+"-la")
	hkAddr, seaAddrA := link(t, hk, sea, 1, "to-sea", "to-hk")
	_, laAddr := link(t, sea, la, 2, "to-la", "to-sea")
	_ = hkAddr
	m := strings.NewReplacer("HK", hkAddr, "SEATTLE", seaAddrA, "LA", laAddr).Replace(nsManifests)
	certs := relayFiles(t, bin, dir, "chain.yaml", m, "hk", "seattle", "la")

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
	go serveSinkThenSource(tcpTarget)
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
	procs := map[string]*exec.Cmd{"la": relay(la, "la"), "seattle": relay(sea, "seattle"), "hk": relay(hk, "hk")}
	t.Cleanup(func() {
		if t.Failed() {
			for name := range procs {
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
	waitFor(t, "chain up", func() error { return tcpExchange(dial, 1<<10) })

	t.Run("tcp 32 MiB both ways", func(t *testing.T) {
		if err := tcpExchange(dial, 32<<20); err != nil {
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
			p := bytes.Repeat([]byte{byte(size)}, size)
			ok := false
			for range 5 {
				c.Write(p)
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 65535)
				n, err := c.Read(buf)
				if err == nil && bytes.Equal(buf[:n], p) {
					ok = true
					break
				}
			}
			if !ok {
				t.Fatalf("no intact echo of a %d-byte packet", size)
			}
		}
	})
	t.Run("middle relay restart", func(t *testing.T) {
		p := procs["seattle"]
		p.Process.Kill()
		waitProc(p)
		if err := tcpExchange(dial, 1<<10); err == nil {
			t.Fatal("flow succeeded with the middle relay down")
		}
		procs["seattle"] = relay(sea, "seattle")
		waitFor(t, "recovery", func() error { return tcpExchange(dial, 1<<20) })
	})
	t.Run("metrics and clean shutdown", func(t *testing.T) {
		// The restarted seattle is up again for hk once hk's control link
		// reached it and a probe round heard it (flows recovered sooner,
		// over the TLS links).
		waitFor(t, "hk counts seattle up", func() error {
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
		p := procs["hk"]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- waitProc(p) }()
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

// relayFiles writes a manifest into dir and makes a CA with certificates for
// the named relays, as a user would before starting relay processes; it
// returns the certificate directory.
func relayFiles(t *testing.T, bin, dir, file, manifest string, relays ...string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	run(t, bin, "cert", "ca", "--certs", certs)
	run(t, append([]string{bin, "cert", "issue", "--certs", certs}, relays...)...)
	return certs
}

func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sinkThenSource starts a serveSinkThenSource target on loopback until the
// test ends and returns its address.
func sinkThenSource(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveSinkThenSource(ln)
	return ln.Addr().String()
}

// serveSinkThenSource reads each connection to EOF, then answers with as
// many pseudo-random bytes (seeded by the count) followed by the SHA-256 of
// what it read, and closes.
func serveSinkThenSource(ln net.Listener) {
	testutil.Serve(ln, func(c *net.TCPConn) {
		h := sha256.New()
		n, _ := io.Copy(h, c)
		io.Copy(c, testutil.RandReader(uint64(n), n))
		c.Write(h.Sum(nil))
	})
}

// tcpExchange sends size bytes, half-closes, and checks the answer: size
// bytes of the expected stream, then the digest of what was sent.
func tcpExchange(dial func() (net.Conn, error), size int64) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	sent := sha256.New()
	go func() {
		io.Copy(c, io.TeeReader(testutil.RandReader(1, size), sent))
		c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got := sha256.New()
	n, err := io.Copy(got, io.LimitReader(c, size))
	if err != nil || n != size {
		return fmt.Errorf("answer: %d of %d bytes, %v", n, size, err)
	}
	want := sha256.New()
	io.Copy(want, testutil.RandReader(uint64(size), size))
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		return fmt.Errorf("answer corrupted")
	}
	digest, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("digest: %v", err)
	}
	if !bytes.Equal(digest, sent.Sum(nil)) {
		return fmt.Errorf("target received different bytes than were sent (%d-byte digest)", len(digest))
	}
	return nil
}

// procWaits holds one Wait per process: a test and its cleanup may both
// wait for a relay, and exec.Cmd.Wait must not run twice at once.
var procWaits sync.Map // *exec.Cmd -> func() error

// waitProc waits for c to exit; every caller gets the same result.
func waitProc(c *exec.Cmd) error {
	w, _ := procWaits.LoadOrStore(c, sync.OnceValue(c.Wait))
	return w.(func() error)()
}
