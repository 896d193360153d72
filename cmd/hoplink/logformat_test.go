package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// Under --log-format json every line on stderr is a JSON record, whatever
// ends the process: an unknown flag, a missing file, a bad flag value, a
// deprecated flag's warning, a relay without certificates, an operator
// without a cluster, and what client-go logs (klog) in a command that
// sets no logger of its own: status --kube whose credential plugin fails.
func TestJSONLogsAreOnlyJSON(t *testing.T) {
	bin := procs.Hoplink(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("kind: Chain\nspec:\n\troute: [a]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		// says is in one of the lines: what shows the path was taken.
		says string
	}{
		{args: []string{"--log-format", "json", "--no-such-flag"}},
		{args: []string{"--log-format=json", "local", "-f", "does-not-exist"}},
		{args: []string{"--log-format", "json", "local", "-f", bad}},
		{args: []string{"--log-format", "json", "--log-level", "loud", "local", "-f", "../../examples/local"}},
		{args: []string{"relay", "--log-format", "json", "-f", "../../examples/local", "--relaynode", "hk"}},
		{args: []string{"--log-format", "json", "relay", "-f", "../../examples/local", "--name", "seatle", "--certs", "none"}},
		{args: []string{"--log-format", "json", "operator", "--kubeconfig", "does-not-exist", "--metrics-bind-address", ":0"}},
		{args: []string{"--log-format", "json", "cert", "issue", "--certs", t.TempDir(), "Not_A_Name"}},
		{args: []string{"--log-format", "json", "status", "--kube", "--kubeconfig", expiredLogin(t)}, says: "refreshing credentials"},
	} {
		args := tc.args
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if err == nil {
			t.Errorf("%v: exit 0, want a failure", args)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		var last map[string]any
		said := false
		for _, line := range lines {
			last = nil
			if err := json.Unmarshal([]byte(line), &last); err != nil || last["level"] == nil || last["msg"] == nil {
				t.Errorf("%v: a line that is not a JSON record: %s", args, line)
			}
			said = said || tc.says != "" && strings.Contains(line, tc.says)
		}
		if tc.says != "" && !said {
			t.Errorf("%v: no line says %q: the path this case is for was not taken:\n%s", args, tc.says, stderr.String())
		}
		if last == nil || last["level"] != "ERROR" || !strings.HasPrefix(last["msg"].(string), "hoplink: ") || last["exit_code"] != 1.0 {
			t.Errorf("%v: the last line is not the error that ends the process: %s", args, lines[len(lines)-1])
		}
	}
}

// expiredLogin is a kubeconfig for an API server that refuses every
// request (401), with a credential plugin that gives a token once and
// then fails, silently, as an expired login does. client-go, refused,
// runs the plugin again and logs its failure through klog.
func expiredLogin(t *testing.T) string {
	t.Helper()
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401}`)
	}))
	t.Cleanup(api.Close)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "login")
	script := "#!/bin/sh\n[ -e \"$0.used\" ] && exit 1\n: > \"$0.used\"\n" +
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t"}}'` + "\n"
	if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: %q, interactiveMode: Never}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, api.URL, plugin)
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A panic of the main goroutine comes out as a JSON record with its stack.
func TestJSONPanic(t *testing.T) {
	var stderr bytes.Buffer
	lf := &logFlags{}
	root := newRootLogs(lf)
	root.AddCommand(&cobra.Command{Use: "panic-now", Run: func(*cobra.Command, []string) { panic("boom") }})
	code := runMainWith(root, lf, []string{"--log-format", "json", "panic-now"}, &stderr)
	var rec map[string]any
	if err := json.Unmarshal(stderr.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %s", stderr.String())
	}
	if code != 2 || rec["msg"] != "panic: boom" || rec["stack"] == nil {
		t.Fatalf("exit %d, record %v", code, rec)
	}
}

// The logger every command makes is rate-limited: a flood of one
// condition is one line until the window ends.
func TestCommandLoggerLimitsRepeats(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		lf := &logFlags{level: "info", format: format}
		l, err := lf.loggerTo(&b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 199 {
			l.Warn("no route for flow", "tunnel", "default/t", "err", fmt.Errorf("no route yet\nflow %d", i))
		}
		lf.limiter.Flush()
		if n := strings.Count(b.String(), "\n"); n != 2 || !strings.Contains(b.String(), "suppressed") || strings.Contains(b.String(), `\n`) {
			t.Errorf("%s: %d lines:\n%s", format, n, b.String())
		}
	}
}

// A field has one type in every line: a local network run under
// --log-format json, with flows to a target that is down, logs no key as
// a string in one line and a list or number in another.
func TestLogFieldsHaveOneType(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	ports := map[string]string{}
	for _, p := range []string{"7401", "7402", "7403", "15200", "15201", "15202", "15353", "9464", "5201", "5353"} {
		ports[p] = freePort(t)
	}
	for _, f := range []string{"chain.yaml", "tunnels.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../examples/local", f))
		if err != nil {
			t.Fatal(err)
		}
		s := regexp.MustCompile(`\b\d{4,5}\b`).ReplaceAllStringFunc(string(b), func(p string) string {
			if to, ok := ports[p]; ok {
				return to
			}
			return p
		})
		if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "local", "-f", dir, "--log-format", "json", "--log-level", "debug")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Flows to targets nobody listens on: dial errors at the exit.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range []string{"15200", "15201", "15202"} {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+ports[p], 200*time.Millisecond); err == nil {
				c.SetDeadline(time.Now().Add(300 * time.Millisecond))
				io.Copy(io.Discard, c)
				c.Close()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	types := map[string]map[string][]string{} // key, type: messages
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		n++
		msg, _ := rec["msg"].(string)
		walkTypes("", rec, func(key, typ string) {
			if types[key] == nil {
				types[key] = map[string][]string{}
			}
			types[key][typ] = append(types[key][typ], msg)
		})
	}
	if n < 20 {
		t.Fatalf("only %d lines: the local network did not run?\n%s", n, stderr.String())
	}
	var keys []string
	for k := range types {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(types[k]) > 1 {
			t.Errorf("field %q has types %v", k, types[k])
		}
	}
}

// walkTypes calls f with the JSON type of every field of rec, nested keys
// joined by dots; null goes with any type.
func walkTypes(prefix string, rec map[string]any, f func(key, typ string)) {
	for k, v := range rec {
		switch v := v.(type) {
		case nil:
		case map[string]any:
			walkTypes(prefix+k+".", v, f)
		case string:
			f(prefix+k, "string")
		case float64:
			f(prefix+k, "number")
		case bool:
			f(prefix+k, "bool")
		case []any:
			f(prefix+k, "list")
		}
	}
}

func freePort(t *testing.T) string {
	return fmt.Sprint(testutil.FreePort(t))
}

// client-go's and controller-runtime's logs (klog, logr) come out through
// the command's logger: JSON under --log-format json, one line each.
func TestKlogGoesThroughTheLogger(t *testing.T) {
	var b bytes.Buffer
	lf := &logFlags{level: "info", format: "json"}
	l, err := lf.loggerTo(&b)
	if err != nil {
		t.Fatal(err)
	}
	useSlog(l)
	defer klog.ClearLogger()
	klog.InfoS("watch started", "resource", "relaynodes")
	klog.Warningf("a warning\nover two lines")
	klog.ErrorS(errors.New("connection refused"), "list failed", "resource", "chains")
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), b.String())
	}
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] == nil {
			t.Errorf("not a JSON record: %s", line)
		} else if strings.Contains(rec["msg"].(string), "\n") {
			t.Errorf("a line break in the message: %s", line)
		}
	}
}

// An entry relay whose only next hop is down, under a burst of 200 flows:
// the log says each condition once, not once a flow, and the count of what
// it left out comes out when the relay exits.
func TestFlowsWithNoRouteAreOneLine(t *testing.T) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	for _, args := range [][]string{{"cert", "ca", "--certs", dir}, {"cert", "issue", "--certs", dir, "hk", "la"}} {
		if out, err := execute(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	hk, la, listen := freePort(t), freePort(t), freePort(t)
	manifests := fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %[1]s}, endpoints: ["127.0.0.1:%[1]s"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[2]s}, endpoints: ["127.0.0.1:%[2]s"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %[3]s}, target: "127.0.0.1:9"}
`, hk, la, listen)
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "relay", "-f", filepath.Join(dir, "net.yaml"), "--name", "hk", "--certs", dir, "--log-format", "json")
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), `"msg":"tunnel open"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no tunnel open:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 200 {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+listen, time.Second); err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			io.Copy(io.Discard, c)
			c.Close()
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	lines := map[string]int{} // by condition
	flows := 0.0              // failed flows the lines stand for
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		if rec["level"] != "WARN" && rec["level"] != "ERROR" {
			continue
		}
		// A condition: the message and the names in the line (not the
		// error's text, which may differ between occurrences).
		var names []string
		for k, v := range rec {
			if s, ok := v.(string); ok && k != "time" && k != "err" && k != "window" {
				names = append(names, k+"="+s)
			}
		}
		sort.Strings(names)
		cond := strings.Join(names, " ")
		lines[cond]++
		n, _ := rec["suppressed"].(float64)
		if m := rec["msg"]; m == "no route for flow" || m == "next hop unavailable" {
			flows += n + 1
		}
	}
	for cond, n := range lines {
		if n > 3 {
			t.Errorf("%s: %d lines, want at most the first, one a window and the count at exit", cond, n)
		}
	}
	if flows < 200 {
		t.Errorf("the lines stand for %v failed flows, want 200 (lines by message: %v):\n%s", flows, lines, stderr.String())
	}
}
