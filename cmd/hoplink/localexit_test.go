package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
)

// localNetwork writes a two-relay network on free loopback ports and
// returns its directory.
func localNetwork(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	a, b, listen := freePort(t), freePort(t), freePort(t)
	doc := fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {address: 127.0.0.1, port: %s}, endpoints: ["127.0.0.1:%s"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {address: 127.0.0.1, port: %s}, endpoints: ["127.0.0.1:%s"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: ab}
spec: {entry: a, exit: b, mode: static, route: [a, b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: web}
spec: {chain: ab, protocol: tcp, listen: {address: 127.0.0.1, port: %s}, target: "127.0.0.1:9"}
`, a, a, b, b, listen)
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startLocal runs 'hoplink local' on net with its own TMPDIR, and returns
// once it logged the command that inspects it, with the rest of its
// standard error to read from.
func startLocal(t *testing.T, bin, net, tmp string, args ...string) (*exec.Cmd, *bufio.Reader, io.Closer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"local", "-f", net}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	br := bufio.NewReader(r)
	var log strings.Builder
	for {
		line, err := br.ReadString('\n')
		log.WriteString(line)
		if strings.Contains(line, "inspect it with") {
			return cmd, br, r
		}
		if err != nil {
			cmd.Wait()
			t.Fatalf("hoplink local %s ended before it was up: %v\n%s", strings.Join(args, " "), err, log.String())
		}
	}
}

// waitExit waits for cmd to end, at most 30 s.
func waitExit(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30 s after the signal")
		return nil
	}
}

// "0" turns the metrics server off in 'local' as it does in the operator;
// it was taken for an address and failed on its missing port.
func TestLocalMetricsAddrZeroIsOff(t *testing.T) {
	bin := procs.Hoplink(t)
	net := localNetwork(t)
	for _, addr := range []string{"0", ""} {
		cmd, rest, _ := startLocal(t, bin, net, t.TempDir(), "--metrics-addr", addr)
		go io.Copy(io.Discard, rest)
		cmd.Process.Signal(os.Interrupt)
		if err := waitExit(t, cmd); err != nil {
			t.Errorf("--metrics-addr %q: %v", addr, err)
		}
	}
}

// Every address flag says the same of how it is turned off.
func TestAddressFlagsSayHowTheyAreOff(t *testing.T) {
	for _, c := range commands() {
		for _, name := range []string{"metrics-addr", "health-probe-addr", "pprof-addr"} {
			if f := c.LocalFlags().Lookup(name); f != nil && !strings.Contains(f.Usage, "(0 or empty: not served)") {
				t.Errorf("%s --%s: %q does not say 0 or empty turn it off", c.CommandPath(), name, f.Usage)
			}
		}
	}
	if got := offAsZero(""); got != "0" {
		t.Errorf("the operator's empty address goes to controller-runtime as %q, which serves its default port", got)
	}
}

// 'hoplink local' removes the directory it made for the observer's files
// however it is stopped: by SIGINT or SIGTERM, and by Ctrl-C under
// 'make demo | tee', where tee dies with it and the next log line found no
// reader (SIGPIPE killed the process before its cleanup).
func TestLocalRemovesItsDirectory(t *testing.T) {
	bin := procs.Hoplink(t)
	net := localNetwork(t)
	for _, tc := range []struct {
		name     string
		sig      os.Signal
		noReader bool
	}{
		{"SIGINT", os.Interrupt, false},
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGINT, stderr without a reader", os.Interrupt, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			cmd, rest, r := startLocal(t, bin, net, tmp, "--drain-timeout", "1s")
			made, _ := filepath.Glob(filepath.Join(tmp, "hoplink-local-*"))
			if len(made) != 1 {
				t.Fatalf("made %v in its TMPDIR, want one hoplink-local-* directory", made)
			}
			if tc.noReader {
				r.Close()
			} else {
				go io.Copy(io.Discard, rest)
			}
			cmd.Process.Signal(tc.sig)
			err := waitExit(t, cmd)
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Errorf("killed by %v", ws.Signal())
			} else if err != nil && !tc.noReader {
				t.Errorf("exit: %v", err)
			}
			if left, _ := filepath.Glob(filepath.Join(tmp, "hoplink-local-*")); len(left) > 0 {
				t.Errorf("%v outlived the process", left)
			}
		})
	}
}
