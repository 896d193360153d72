package main

import (
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

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// drainNet is relay processes on loopback with one chain c from hk to la
// and a TCP Tunnel into it.
type drainNet struct {
	t      *testing.T
	procs  map[string]*exec.Cmd
	logs   map[string]string
	listen string // the Tunnel's listen address on hk
	file   string // the manifests
	certs  string // ca.* and the relays' certificates
}

// startDrainNet starts relays hk, the middles and la (each its own
// process) with chain spec c (YAML flow mapping, from hk to la).
func startDrainNet(t *testing.T, bin, target string, middles []string, chain string) *drainNet {
	t.Helper()
	dir := t.TempDir()
	relays := append(append([]string{"hk"}, middles...), "la")
	tunnelPort := testutil.FreePort(t)
	var b strings.Builder
	for _, r := range relays {
		port := testutil.FreePort(t)
		fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n---\n", r, port, port)
	}
	fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: %s\n---\n", chain)
	fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: %q}\n", tunnelPort, target)
	certs := relayFiles(t, bin, dir, "net.yaml", b.String(), relays...)
	n := &drainNet{t: t, procs: map[string]*exec.Cmd{}, logs: map[string]string{}, listen: fmt.Sprintf("127.0.0.1:%d", tunnelPort),
		file: filepath.Join(dir, "net.yaml"), certs: certs}
	for _, r := range relays {
		n.logs[r] = filepath.Join(dir, r+".log")
		out, err := os.Create(n.logs[r])
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "relay", "-f", filepath.Join(dir, "net.yaml"), "--name", r, "--certs", certs, "--drain-timeout", "20s")
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		n.procs[r] = cmd
		t.Cleanup(func() {
			cmd.Process.Kill()
			waitProc(cmd)
			out.Close()
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for r := range n.logs {
				t.Logf("--- %s log:\n%s", r, n.log(r))
			}
		}
	})
	waitFor(t, "the chain carries a flow", func() error {
		return tcpExchange(func() (net.Conn, error) { return net.Dial("tcp", n.listen) }, 1000)
	})
	return n
}

func (n *drainNet) log(relay string) string {
	b, _ := os.ReadFile(n.logs[relay])
	return string(b)
}

// slowExchange is tcpExchange with the client's bytes paced over about
// pace: a transfer that is open when a relay is told to stop.
func slowExchange(addr string, size int64, pace time.Duration) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	chunks := int64(64)
	return tcpExchange(func() (net.Conn, error) {
		return &pacedConn{TCPConn: c.(*net.TCPConn), chunk: int(size / chunks), gap: pace / time.Duration(chunks)}, nil
	}, size)
}

// pacedConn writes in chunks with a pause between them.
type pacedConn struct {
	*net.TCPConn
	chunk int
	gap   time.Duration
}

func (p *pacedConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), p.chunk)
		w, err := p.TCPConn.Write(b[:k])
		n += w
		if err != nil {
			return n, err
		}
		b = b[k:]
		time.Sleep(p.gap)
	}
	return n, nil
}

// ReadFrom keeps io.Copy on the paced Write.
func (p *pacedConn) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{p}, r)
}

// refusedWithin opens a flow through the Tunnel and says how long it took
// to be refused: a connect refused, or a reset or EOF before any answer.
func refusedWithin(addr string) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return time.Since(start), nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("hello"))
	var b [16]byte
	if _, err := c.Read(b[:]); err == nil {
		return 0, errors.New("the flow was carried, not refused")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return 0, errors.New("the flow hung: neither carried nor refused")
	}
	return time.Since(start), nil
}

// TestDrain stops each relay of a three-relay chain with SIGTERM while a
// transfer crosses it: the transfer completes byte-exact, a new flow is
// refused fast (the entry's listener is closed; an entry whose next hop
// drains refuses at once), and the relay exits once its flows ended, well
// before its drain timeout.
func TestDrain(t *testing.T) {
	bin := buildHoplink(t)
	target := sinkThenSource(t)

	for _, transport := range []string{"quic", "tls"} {
		for _, role := range []string{"hk", "m", "la"} {
			t.Run(transport+"/"+role, func(t *testing.T) {
				n := startDrainNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: "+transport+"}")
				done := make(chan error, 1)
				go func() { done <- slowExchange(n.listen, 4<<20, 1500*time.Millisecond) }()
				time.Sleep(300 * time.Millisecond)
				p := n.procs[role]
				stopped := time.Now()
				p.Process.Signal(syscall.SIGTERM)
				exited := make(chan error, 1)
				go func() { exited <- waitProc(p) }()

				// The news reaches the entry within a round trip.
				time.Sleep(100 * time.Millisecond)
				took, err := refusedWithin(n.listen)
				if err != nil {
					t.Errorf("a new flow while %s drains: %v", role, err)
				} else if took > 100*time.Millisecond {
					t.Errorf("a new flow while %s drains was refused after %v, want within 100ms", role, took)
				}

				if err := <-done; err != nil {
					t.Fatalf("the open transfer across %s's drain: %v\n%s", role, err, n.log(role))
				}
				select {
				case err := <-exited:
					if err != nil {
						t.Errorf("%s exited with %v", role, err)
					}
					if d := time.Since(stopped); d > 10*time.Second {
						t.Errorf("%s took %v to exit after its flows ended", role, d)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s still runs 10s after its last flow ended\n%s", role, n.log(role))
				}
				if l := n.log(role); !strings.Contains(l, "drained: every flow ended") {
					t.Errorf("%s's log does not say it drained:\n%s", role, l)
				}
			})
		}
	}

	// A routed chain moves off a relay that drains: new flows keep
	// working (the draining relay would refuse them) while the open one
	// finishes through it.
	t.Run("routed chain moves", func(t *testing.T) {
		n := startDrainNet(t, bin, target, []string{"m1", "m2"},
			"{entry: hk, exit: la, via: [m1, m2], mode: sum, route: [hk, m1, la], probe: {interval: 500ms}}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.listen, 4<<20, 2*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		p := n.procs["m1"]
		p.Process.Signal(syscall.SIGTERM)
		exited := make(chan error, 1)
		go func() { exited <- waitProc(p) }()
		time.Sleep(100 * time.Millisecond) // the news reaches hk
		for i := range 5 {
			start := time.Now()
			if err := tcpExchange(func() (net.Conn, error) { return net.Dial("tcp", n.listen) }, 10000); err != nil {
				t.Fatalf("new flow %d while m1 drains: %v\n%s", i, err, n.log("hk"))
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("new flow %d while m1 drains took %v", i, d)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("the open transfer across m1's drain: %v", err)
		}
		l := n.log("hk")
		_, moved, ok := strings.Cut(l, "from=hk,m1,la to=")
		if moved, _, _ = strings.Cut(moved, " "); !ok || strings.Contains(moved, "m1") {
			t.Errorf("hk's log shows no move off m1:\n%s", l)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("m1 still runs 10s after its last flow ended\n%s", n.log("m1"))
		}
	})

	t.Run("second signal", func(t *testing.T) {
		n := startDrainNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: quic}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.listen, 4<<20, 3*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		p := n.procs["m"]
		p.Process.Signal(syscall.SIGTERM)
		time.Sleep(200 * time.Millisecond)
		second := time.Now()
		p.Process.Signal(syscall.SIGTERM)
		exited := make(chan error, 1)
		go func() { exited <- waitProc(p) }()
		select {
		case <-exited:
			if d := time.Since(second); d > 2*time.Second {
				t.Errorf("a second signal took %v to stop the relay", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a second signal did not stop the draining relay")
		}
		if err := <-done; err == nil {
			t.Error("the transfer through a relay stopped at once completed; the second signal did not end its flows")
		}
	})
}
