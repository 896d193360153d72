package procs

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// Net is relay processes on loopback with one chain c from hk to la and a
// TCP Tunnel t into it.
type Net struct {
	Procs  map[string]*exec.Cmd
	logs   map[string]string
	Listen string // the Tunnel's listen address on hk
	File   string // the manifests
	Certs  string // ca.* and the relays' certificates
}

// StartNet starts relays hk, the middles and la, each its own process with
// a drain timeout of 20 s, with chain spec c (a YAML flow mapping, from hk
// to la) and Tunnel t to target, and returns once the chain carries a flow
// to a testutil.ServeSinkThenSource target.
func StartNet(t testing.TB, bin, target string, middles []string, chain string) *Net {
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
	certs := RelayFiles(t, bin, dir, "net.yaml", b.String(), relays...)
	n := &Net{Procs: map[string]*exec.Cmd{}, logs: map[string]string{}, Listen: fmt.Sprintf("127.0.0.1:%d", tunnelPort),
		File: filepath.Join(dir, "net.yaml"), Certs: certs}
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
		n.Procs[r] = cmd
		t.Cleanup(func() {
			cmd.Process.Kill()
			Wait(cmd)
			out.Close()
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for r := range n.logs {
				t.Logf("--- %s log:\n%s", r, n.Log(r))
			}
		}
	})
	testutil.WaitFor(t, "the chain carries a flow", func() error {
		return testutil.TCPExchange(func() (net.Conn, error) { return net.Dial("tcp", n.Listen) }, 1000)
	})
	return n
}

// Log is what a relay has logged so far.
func (n *Net) Log(relay string) string {
	b, _ := os.ReadFile(n.logs[relay])
	return string(b)
}
