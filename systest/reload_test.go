package systest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// reloadNet is three standalone relays hk -> m -> la reading one manifest
// file and one certificate directory, as relays on three hosts would.
type reloadNet struct {
	t           *testing.T
	bin, dir    string
	certs       string
	relayPorts  map[string]int
	procs       map[string]*exec.Cmd
	logs        map[string]string
	tunnelPorts map[string]int
	target      string
}

func (n *reloadNet) manifest(tunnels ...string) string {
	var b strings.Builder
	for _, r := range []string{"hk", "m", "la"} {
		p := n.relayPorts[r]
		fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n---\n", r, p, p)
	}
	b.WriteString("apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: hk, exit: la, via: [m], route: [hk, m, la], transport: quic}\n")
	for _, tn := range tunnels {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: %q}\n", tn, n.tunnelPorts[tn], n.target)
	}
	return b.String()
}

func (n *reloadNet) start(r string) {
	n.logs[r] = filepath.Join(n.dir, r+".log")
	out, err := os.OpenFile(n.logs[r], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(n.bin, "relay", "-f", filepath.Join(n.dir, "net.yaml"), "--name", r, "--certs", n.certs)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.procs[r] = cmd
	n.t.Cleanup(func() {
		cmd.Process.Kill()
		procs.Wait(cmd)
		out.Close()
	})
}

func (n *reloadNet) log(r string) string {
	b, _ := os.ReadFile(n.logs[r])
	return string(b)
}

// hup signals every relay and waits until each logged line want once more
// than before.
func (n *reloadNet) hup(want string) {
	n.t.Helper()
	before := map[string]int{}
	for r := range n.procs {
		before[r] = strings.Count(n.log(r), want)
		n.procs[r].Process.Signal(syscall.SIGHUP)
	}
	for r := range n.procs {
		testutil.WaitFor(n.t, r+" logs "+want, func() error {
			if strings.Count(n.log(r), want) <= before[r] {
				return fmt.Errorf("not yet:\n%s", n.log(r))
			}
			return nil
		})
	}
}

func (n *reloadNet) dial(tunnel string) func() (net.Conn, error) {
	return func() (net.Conn, error) {
		return net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.tunnelPorts[tunnel]), 5*time.Second)
	}
}

// TestReloadAndRotate changes a standalone network's files under an open
// transfer: a SIGHUP adds a Tunnel and removes another, then the CA rotates
// in its three steps (trust both CAs, certificates of the new, the new CA
// alone). The transfer, on a third Tunnel, completes byte-exact across all
// of it, and a relay restarted with the new files alone joins the others:
// the network never split.
func TestReloadAndRotate(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	n := &reloadNet{t: t, bin: bin, dir: dir, target: testutil.SinkThenSource(t), procs: map[string]*exec.Cmd{}, logs: map[string]string{},
		relayPorts: map[string]int{}, tunnelPorts: map[string]int{}}
	for _, r := range []string{"hk", "m", "la"} {
		n.relayPorts[r] = testutil.FreePort(t)
	}
	for _, tn := range []string{"keep", "removed", "added"} {
		n.tunnelPorts[tn] = testutil.FreePort(t)
	}
	n.certs = procs.RelayFiles(t, bin, dir, "net.yaml", n.manifest("keep", "removed"), "hk", "m", "la")
	for _, r := range []string{"la", "m", "hk"} {
		n.start(r)
	}
	for _, tn := range []string{"keep", "removed"} {
		testutil.WaitFor(t, tn+" carries a flow", func() error { return testutil.TCPExchange(n.dial(tn), 1000) })
	}

	done := make(chan error, 1)
	go func() { done <- slowExchange(fmt.Sprintf("127.0.0.1:%d", n.tunnelPorts["keep"]), 4<<20, 5*time.Second) }()
	time.Sleep(300 * time.Millisecond)

	// SIGHUP: one Tunnel in, one out.
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), []byte(n.manifest("keep", "added")), 0o644); err != nil {
		t.Fatal(err)
	}
	n.hup("manifests reloaded")
	if err := testutil.TCPExchange(n.dial("added"), 100000); err != nil {
		t.Errorf("the Tunnel added by SIGHUP: %v", err)
	}
	if c, err := n.dial("removed")(); err == nil {
		c.Close()
		t.Error("the Tunnel removed by SIGHUP still accepts")
	}

	// The CA rotates. certs2 holds the new CA and its certificates.
	certs2 := filepath.Join(dir, "certs2")
	procs.Run(t, bin, "cert", "ca", "--certs", certs2)
	procs.Run(t, bin, "cert", "issue", "--certs", certs2, "hk", "m", "la")
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	oldCA, newCA := read(filepath.Join(n.certs, "ca.crt")), read(filepath.Join(certs2, "ca.crt"))
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(n.certs, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.crt", append(append([]byte{}, oldCA...), newCA...))
	n.hup("certificates reloaded")
	for _, r := range []string{"hk", "m", "la"} {
		write(r+".key", read(filepath.Join(certs2, r+".key")))
		write(r+".crt", read(filepath.Join(certs2, r+".crt")))
	}
	n.hup("certificates reloaded")
	write("ca.crt", newCA)
	n.hup("certificates reloaded")
	if err := testutil.TCPExchange(n.dial("added"), 100000); err != nil {
		t.Errorf("a new flow after the rotation: %v", err)
	}

	if err := <-done; err != nil {
		t.Fatalf("the transfer open across the reload and the rotation: %v", err)
	}

	// m restarts with the new files only: hk and la must take its new
	// certificate, and it theirs, over new connections.
	n.procs["m"].Process.Signal(syscall.SIGTERM)
	procs.Wait(n.procs["m"])
	n.start("m")
	testutil.WaitFor(t, "a flow through the restarted m", func() error { return testutil.TCPExchange(n.dial("keep"), 100000) })
	for _, r := range []string{"hk", "la"} {
		if l := n.log(r); strings.Contains(l, "rejected peer certificate") {
			t.Errorf("%s rejected something during the rotation:\n%s", r, l)
		}
	}
}

// TestRejectedReloadsAreCountedAndSettled: manifests with a typo, signalled
// twice, are refused and counted (hoplink_reloads_rejected_total); once
// fixed and signalled, the log's last line is the reload, not the refusal
// held back from the second signal, which comes before it with its count.
func TestRejectedReloadsAreCountedAndSettled(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	port, tunnelPort, metricsPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	good := fmt.Sprintf("apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: hk}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n"+
		"---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: hk, exit: hk, route: [hk]}\n"+
		"---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, %s: \"127.0.0.1:9\"}\n", port, port, tunnelPort, "%s")
	file := filepath.Join(dir, "net.yaml")
	certs := procs.RelayFiles(t, bin, dir, "net.yaml", fmt.Sprintf(good, "target"), "hk")
	logFile := filepath.Join(dir, "hk.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", metricsPort)
	cmd := exec.Command(bin, "relay", "-f", file, "--name", "hk", "--certs", certs, "--metrics-addr", metricsAddr)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); procs.Wait(cmd) })
	logged := func() string { b, _ := os.ReadFile(logFile); return string(b) }
	waitUntil := func(what string, n int) {
		t.Helper()
		testutil.WaitFor(t, fmt.Sprintf("%d lines saying %q", n, what), func() error {
			if c := strings.Count(logged(), what); c < n {
				return fmt.Errorf("%d:\n%s", c, logged())
			}
			return nil
		})
	}
	waitUntil("relay started", 1)
	os.WriteFile(file, []byte(fmt.Sprintf(good, "targte")), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitUntil("manifests rejected", 1)
	cmd.Process.Signal(syscall.SIGHUP) // held back: a repeat within 10 s
	testutil.WaitFor(t, "two rejected reloads counted", func() error {
		m, err := httpGet("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(m, `hoplink_reloads_rejected_total{relay="hk",what="manifests"} 2`) {
			return fmt.Errorf("metrics:\n%s", m)
		}
		return nil
	})
	os.WriteFile(file, []byte(fmt.Sprintf(good, "target")), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitUntil("manifests reloaded", 1)
	time.Sleep(11 * time.Second) // past the window that held the second refusal
	lines := strings.Split(strings.TrimSpace(logged()), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, "manifests reloaded") {
		t.Errorf("the log's last line is %q, not the reload:\n%s", last, logged())
	}
	if strings.Count(logged(), "manifests rejected") != 2 || !strings.Contains(logged(), "suppressed=1") {
		t.Errorf("want the refusal, then its held-back repeat with its count, before the reload:\n%s", logged())
	}
}
