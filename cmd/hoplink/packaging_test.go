package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

const unitFile = "../../packaging/systemd/hoplink-relay@.service"

// unit is a systemd unit file: section, key, values in order.
type unit map[string]map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			section = l[1 : len(l)-1]
			u[section] = map[string][]string{}
		case strings.HasSuffix(l, "\\"):
			t.Fatalf("%s:%d: a continued line; the test reads one line per key", path, n)
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", path, n, l)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: %d values, want 1", section, key, len(v))
	}
	return v[0]
}

// TestSystemdUnit checks packaging/systemd/hoplink-relay@.service as
// systemd would use it: systemd-analyze verify finds nothing to say
// (where it is installed; CI installs it), and its ExecStart, on files
// laid out as docs/standalone.md says under a directory of the test's,
// runs a relay that turns ready, reloads on its ExecReload and stops on
// its KillSignal with exit 0 within TimeoutStopSec.
func TestSystemdUnit(t *testing.T) {
	u := readUnit(t, unitFile)
	bin := procs.Hoplink(t)
	start := u.one(t, "Service", "ExecStart")
	const installed = "/usr/local/bin/hoplink "
	if !strings.HasPrefix(start, installed) || strings.ContainsAny(start, `"'$`) {
		t.Fatalf("ExecStart %q: want %s and plain words (the test splits it on spaces)", start, installed)
	}

	if analyze, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze not installed (Debian: systemd); CI checks the unit with it")
		}
		t.Log("systemd-analyze not installed: the unit is not verified by it")
	} else {
		// verify wants ExecStart's binary to exist: point it at ours.
		dir := t.TempDir()
		b, _ := os.ReadFile(unitFile)
		b = bytes.ReplaceAll(b, []byte(strings.TrimSpace(installed)), []byte(bin))
		if err := os.WriteFile(filepath.Join(dir, "hoplink-relay@.service"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("hoplink-relay@.service", filepath.Join(dir, "hoplink-relay@hk.service")); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", filepath.Join(dir, "hoplink-relay@hk.service")).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	// /etc/hoplink, as docs/standalone.md lays it out, for relay hk.
	etc := t.TempDir()
	port, metrics := testutil.FreePort(t), testutil.FreePort(t)
	if err := os.MkdirAll(filepath.Join(etc, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := fmt.Sprintf("apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: hk}\nspec: {listen: {address: 127.0.0.1, port: %d}}\n", port)
	if err := os.WriteFile(filepath.Join(etc, "manifests", "relays.yaml"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"cert", "ca", "--certs", filepath.Join(etc, "certs")}, {"cert", "issue", "--certs", filepath.Join(etc, "certs"), "hk"}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	var args []string
	words := strings.Fields(start)
	for i := 1; i < len(words); i++ {
		w := strings.ReplaceAll(strings.ReplaceAll(words[i], "%i", "hk"), "/etc/hoplink", etc)
		if words[i-1] == "--metrics-addr" {
			w = fmt.Sprintf("127.0.0.1:%d", metrics) // the unit's is fixed; tests run side by side
		}
		args = append(args, w)
	}
	if !strings.Contains(strings.Join(args, " "), "--name hk") {
		t.Errorf("ExecStart %q does not run the instance's relay (--name %%i)", start)
	}
	cmd := exec.Command(bin, args...)
	logs := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
	})
	fatal := func(format string, a ...any) {
		t.Helper()
		if !exited {
			cmd.Process.Kill()
			<-done
			exited = true
		}
		t.Fatalf(format+"\nrelay log:\n%s", append(a, logs.String())...)
	}
	ready := func() bool {
		r, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", metrics))
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	}
	for deadline := time.Now().Add(20 * time.Second); !ready(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			fatal("the unit's relay is not ready after 20 s")
		}
	}

	// ExecReload, with $MAINPID as systemd sets it; the relay logs the reload.
	reload := strings.Fields(strings.ReplaceAll(u.one(t, "Service", "ExecReload"), "$MAINPID", strconv.Itoa(cmd.Process.Pid)))
	if out, err := exec.Command(reload[0], reload[1:]...).CombinedOutput(); err != nil {
		fatal("ExecReload %v: %v\n%s", reload, err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), `msg="manifests reloaded" signal=true`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			fatal("ExecReload %v: the relay did not reload in 10 s", reload)
		}
	}

	signal := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT}[u.one(t, "Service", "KillSignal")]
	if signal == 0 {
		t.Fatalf("KillSignal %q: the relay drains on SIGTERM", u.one(t, "Service", "KillSignal"))
	}
	stopTimeout, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec"))
	if err != nil {
		t.Fatal(err)
	}
	if drain := 30 * time.Second; stopTimeout <= drain {
		t.Errorf("TimeoutStopSec %v: systemd kills the relay before its drain (%v) ends", stopTimeout, drain)
	}
	cmd.Process.Signal(signal)
	select {
	case err := <-done:
		exited = true
		if err != nil {
			t.Errorf("exit after %s: %v\n%s", u.one(t, "Service", "KillSignal"), err, logs.String())
		}
	case <-time.After(stopTimeout):
		fatal("still running %v after %s", stopTimeout, u.one(t, "Service", "KillSignal"))
	}
	if u.one(t, "Install", "WantedBy") != "multi-user.target" || u.one(t, "Service", "User") == "root" {
		t.Errorf("the unit should start at boot as a user of its own: %v", u)
	}
}
