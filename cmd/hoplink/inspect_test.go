package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// twoRelays is a local network: relays hk and la on ports hk and hk+1, a
// Tunnel entering hk on tunnelPort to the discard port.
func twoRelays(hk, tunnelPort int) string {
	return fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: "127.0.0.1:9"}
`, hk, hk, hk+1, hk+1, tunnelPort)
}

var inspectLine = regexp.MustCompile(`msg="inspect it with" command=("(?:[^"\\]|\\.)*")`)

// 'hoplink local' and 'hoplink forward' print the one command that shows
// them, and it works as printed: without --observer-certs they write the
// observer's files into a directory of their own, removed at exit (the CA
// dies with the process); with it, into that directory, which stays.
func TestLocalPrintsTheStatusCommand(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "net.yaml")
	hk, la := freeRun(t, 2), testutil.FreePort(t)
	os.WriteFile(file, []byte(twoRelays(hk, la)), 0o644)
	given := filepath.Join(dir, "my certs")

	for _, tc := range []struct {
		name  string
		args  []string
		certs string // the directory the command names; "" for one of its own
	}{
		{"local", []string{"local", "-f", file}, ""},
		{"local --observer-certs", []string{"local", "-f", file, "--observer-certs", given}, given},
		{"forward", []string{"forward", "--listen", fmt.Sprint(la), "--target", "127.0.0.1:9", "--relay-port", fmt.Sprint(hk)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append(tc.args, "--drain-timeout", "0")...)
			var stderr testutil.Buffer
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			defer func() {
				cmd.Process.Kill()
				<-done
			}()
			var m []string
			for deadline := time.Now().Add(30 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				m = inspectLine.FindStringSubmatch(stderr.String())
			}
			if m == nil {
				t.Fatalf("no line saying how to inspect it:\n%s", stderr.String())
			}
			command, err := strconv.Unquote(m[1])
			if err != nil {
				t.Fatal(err)
			}
			certs, quoted := tc.certs, "'"+tc.certs+"'" // a name with a space, quoted for the shell
			if certs == "" {
				words := strings.Fields(command)
				certs, quoted = words[len(words)-1], words[len(words)-1]
			}
			if !strings.HasPrefix(command, bin+" status -f ") || !strings.HasSuffix(command, " --certs "+quoted) {
				t.Fatalf("command %q, want %s status -f ... --certs %s", command, bin, quoted)
			}
			// As printed, in a shell, waiting for the network to be ready.
			out, err := exec.Command("sh", "-c", command+" --wait --wait-timeout 30s").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "\nready: every relay answers") {
				t.Fatalf("%s: %v\n%s\nstderr of %s:\n%s", command, err, out, tc.name, stderr.String())
			}

			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
				done <- nil // for the deferred Kill's wait
			case <-time.After(30 * time.Second):
				t.Fatalf("still running 30 s after SIGTERM:\n%s", stderr.String())
			}
			_, err = os.Stat(filepath.Join(certs, "observer.crt"))
			switch {
			case tc.certs == "" && !os.IsNotExist(err):
				t.Errorf("%s outlived the process (stat: %v)", certs, err)
			case tc.certs != "" && err != nil:
				t.Errorf("--observer-certs %s: %v after exit; the directory named is kept", certs, err)
			}
		})
	}
}

// TestLocalSaysWhenATunnelIsNotOpen: 'hoplink local' calls its network
// ready only when every Tunnel listens; one whose port is taken makes it
// say the network is up but not ready, and which.
func TestLocalSaysWhenATunnelIsNotOpen(t *testing.T) {
	bin := procs.Hoplink(t)
	file := filepath.Join(t.TempDir(), "net.yaml")
	hk := freeRun(t, 2)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	os.WriteFile(file, []byte(twoRelays(hk, port)), 0o644)
	cmd := exec.Command(bin, "local", "-f", file, "--drain-timeout", "0")
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "inspect it with") && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
	}
	out := stderr.String()
	if strings.Contains(out, "local network ready") || !strings.Contains(out, "local network up, but Tunnels are not open") || !strings.Contains(out, "default/t") {
		t.Errorf("a Tunnel whose port is taken:\n%s", out)
	}
}
