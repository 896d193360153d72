package main

import (
	"encoding/json"
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
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/observe"
	"github.com/hoplink/hoplink/pki"
)

// TestStatusAndProbe runs `hoplink status` and `hoplink probe` against
// relay processes with the observer's certificate: every relay ready, the
// links measured, the chain's route and candidates, the Tunnel open; probe
// measures each hop, the target and every candidate; a killed relay shows
// as down and --wait fails; a relay's certificate is not an observer's.
func TestStatusAndProbe(t *testing.T) {
	bin := procs.Hoplink(t)
	target := testutil.SinkThenSource(t)
	n := procs.StartNet(t, bin, target, []string{"m1", "m2"},
		"{entry: hk, exit: la, via: [m1, m2], mode: sum, maxHops: 2, probe: {interval: 500ms}}")
	if out, err := exec.Command(bin, "cert", "observer", "--certs", n.Certs).CombinedOutput(); err != nil {
		t.Fatalf("cert observer: %v\n%s", err, out)
	}
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append(args, "-f", n.File, "--certs", n.Certs)...).CombinedOutput()
		return string(out), err
	}
	status := func(args ...string) *observe.Report {
		t.Helper()
		out, err := run(append([]string{"status", "-o", "json"}, args...)...)
		if err != nil && !strings.Contains(out, "not ready") {
			t.Fatalf("status: %v\n%s", err, out)
		}
		var r observe.Report
		if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &r); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		return &r
	}

	r := status("--wait", "--wait-timeout", "30s")
	if !r.Ready {
		t.Fatalf("not ready: %v", r.NotReady)
	}
	relays := map[string]observe.Relay{}
	for _, rl := range r.Relays {
		relays[rl.Name] = rl
		if rl.Status == nil || !rl.Status.Ready || rl.Status.CertificateExpires.Before(time.Now()) {
			t.Errorf("relay %s: %+v", rl.Name, rl)
		}
	}
	hk := relays["hk"].Status
	// A route is ready after its first probe round, which on a loaded
	// machine may have measured one candidate only; later rounds (500 ms
	// apart) measure the others.
	for deadline := time.Now().Add(20 * time.Second); hk != nil && len(hk.Chains) == 1 && len(hk.Chains[0].Candidates) < 2 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		for _, rl := range status().Relays {
			if rl.Name == "hk" {
				hk = rl.Status
			}
		}
	}
	if hk == nil || len(hk.Chains) != 1 || len(hk.Chains[0].Route) < 2 || len(hk.Chains[0].Candidates) < 2 {
		t.Fatalf("hk's chains: %+v", hk)
	}
	route := hk.Chains[0].Route
	if hk.Chains[0].Reason == "" || hk.Chains[0].Changed.IsZero() {
		t.Errorf("hk's chain says neither why nor when its route was chosen: %+v", hk.Chains[0])
	}
	if len(hk.Peers) != 3 {
		t.Errorf("hk sees %d peers, want m1, m2 and la: %+v", len(hk.Peers), hk.Peers)
	}
	for _, p := range hk.Peers {
		if !p.Up || p.RTT <= 0 {
			t.Errorf("hk's link to %s: %+v", p.Name, p)
		}
	}
	if len(hk.Entries) != 1 || !hk.Entries[0].Open || hk.Entries[0].Listen != n.Listen {
		t.Errorf("hk's entries: %+v", hk.Entries)
	}
	table, err := run("status")
	if err != nil || !strings.Contains(table, "ready: every relay answers") || !strings.Contains(table, strings.Join(route, " -> ")) {
		t.Errorf("status table (%v):\n%s", err, table)
	}

	// The map: every relay, every link up, the route in bold.
	dot, err := run("status", "--graph")
	if err != nil {
		t.Fatalf("status --graph: %v\n%s", err, dot)
	}
	for _, r := range []string{"hk", "m1", "m2", "la"} {
		if !strings.Contains(dot, fmt.Sprintf("%q [color=forestgreen", r)) {
			t.Errorf("status --graph: relay %s not drawn ready:\n%s", r, dot)
		}
	}
	for _, p := range hk.Peers {
		if !strings.Contains(dot, fmt.Sprintf("\"hk\" -> %q [color=forestgreen", p.Name)) {
			t.Errorf("status --graph: link hk -> %s not drawn up:\n%s", p.Name, dot)
		}
	}
	if !strings.Contains(dot, fmt.Sprintf("%q -> %q [color=forestgreen, fontcolor=forestgreen, label=", route[0], route[1])) || !strings.Contains(dot, "penwidth=2.5, tooltip=\"routes of default/c\"") {
		t.Errorf("status --graph: the route %v not drawn bold:\n%s", route, dot)
	}
	// What the help says to do with it: Graphviz draws it.
	if _, err := exec.LookPath("dot"); err != nil {
		if gate.InCI() {
			t.Errorf("no Graphviz dot to draw the map with (CI installs it): %v", err)
		}
	} else {
		cmd := exec.Command("dot", "-Tsvg")
		cmd.Stdin = strings.NewReader(dot)
		svg, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("dot -Tsvg of the map: %v\n%s", err, svg)
		}
		for _, r := range []string{"hk", "m1", "m2", "la"} {
			if !strings.Contains(string(svg), ">"+r+"</text>") {
				t.Errorf("dot -Tsvg of the map draws no relay %s", r)
			}
		}
	}

	out, err := run("probe", "c", "-o", "json")
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, out)
	}
	var p observe.Probe
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("probe -o json: %v\n%s", err, out)
	}
	if len(p.Hops) != len(p.Route)-1 || len(p.Route) < 2 {
		t.Fatalf("probe hops %+v for route %v", p.Hops, p.Route)
	}
	for _, h := range p.Hops {
		if h.Err != "" || h.RTT <= 0 {
			t.Errorf("hop %s -> %s: %+v", h.From, h.To, h)
		}
	}
	if len(p.Targets) != 1 || !p.Targets[0].Up || p.Targets[0].RTT <= 0 {
		t.Errorf("probe targets: %+v (%s)", p.Targets, p.TargetErr)
	}
	if len(p.Traces) < 2 {
		t.Errorf("probe traced %d routes, want the route and its candidates", len(p.Traces))
	}
	for _, tr := range p.Traces {
		if tr.Err != "" || tr.RTT <= 0 {
			t.Errorf("trace of %v: %+v", tr.Route, tr)
		}
	}
	// Rounds later (every 500 ms) that kept the route, the status still
	// says why it is what it is.
	time.Sleep(1500 * time.Millisecond)
	for _, rl := range status().Relays {
		if rl.Name == "hk" && (len(rl.Status.Chains) != 1 || rl.Status.Chains[0].Reason == "") {
			t.Errorf("rounds after the route was chosen, hk's chain gives no reason: %+v", rl.Status.Chains)
		}
	}
	if out, err := run("probe", "nope"); err == nil || !strings.Contains(out, `no Chain "nope"`) {
		t.Errorf("probe of an unknown chain: %v\n%s", err, out)
	}

	// A relay's certificate is no observer's.
	relayCerts := t.TempDir()
	for from, to := range map[string]string{"ca.crt": "ca.crt", "hk.crt": pki.ObserverCert, "hk.key": pki.ObserverKey} {
		b, err := os.ReadFile(filepath.Join(n.Certs, from))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(relayCerts, to), b, 0o600)
	}
	b, _ := exec.Command(bin, "status", "-o", "json", "-f", n.File, "--certs", relayCerts).CombinedOutput()
	out = string(b)
	var refused observe.Report
	json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &refused)
	for _, rl := range refused.Relays {
		if rl.Status != nil {
			t.Errorf("relay %s answered a relay's certificate", rl.Name)
		}
	}
	if refused.Ready || len(refused.Relays) != 4 {
		t.Errorf("status with a relay's certificate: %s", out)
	}

	// A relay killed: it shows as unreachable, its peers count it down,
	// and --wait gives up with a non-zero exit.
	n.Procs["m1"].Process.Signal(syscall.SIGKILL)
	testutil.WaitFor(t, "hk counts m1 down", func() error {
		r := status()
		for _, rl := range r.Relays {
			if rl.Name == "m1" && rl.Status != nil {
				return fmt.Errorf("m1 still answers")
			}
			if rl.Name == "hk" && rl.Status != nil {
				for _, p := range rl.Status.Peers {
					if p.Name == "m1" && p.Up {
						return fmt.Errorf("hk counts m1 up")
					}
				}
			}
		}
		if r.Ready || !strings.Contains(strings.Join(r.NotReady, "\n"), "relay m1: no answer") {
			return fmt.Errorf("not ready says %v", r.NotReady)
		}
		return nil
	})
	if out, err := run("status", "--wait", "--wait-timeout", "2s"); err == nil || !strings.Contains(out, "not ready") {
		t.Errorf("status --wait with a relay down: %v\n%s", err, out)
	}
	// The map shows it: m1 red, the link to it down.
	dot, _ = run("status", "--graph")
	if !strings.Contains(dot, "\"m1\" [color=red") || !strings.Contains(dot, "\"hk\" -> \"m1\" [color=red, fontcolor=red, label=\"down\"") {
		t.Errorf("status --graph with m1 killed:\n%s", dot)
	}
	// The exit killed too: probe names each failed part once, says what
	// failed in the reader's words (not a stream's reset or a URL), and
	// exits 1.
	n.Procs["la"].Process.Signal(syscall.SIGKILL)
	testutil.WaitFor(t, "probe says the exit la is down", func() error {
		out, err := run("probe", "c")
		if err == nil {
			return fmt.Errorf("probe exits 0 with la killed:\n%s", out)
		}
		for _, want := range []string{"the exit la did not answer: dial tcp", "no answer through the route within ", " (3 times)"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("probe does not say %q:\n%s", want, out)
			}
		}
		table, _, _ := strings.Cut(out, "hoplink: ")
		for _, bad := range []string{`\n`, "stream ", "canceled", "https://"} {
			if strings.Contains(out, bad) {
				return fmt.Errorf("probe says %q:\n%s", bad, out)
			}
		}
		for _, l := range strings.Split(table, "\n") {
			if strings.TrimSpace(l) != "" && strings.Count(table, l) > 1 {
				return fmt.Errorf("probe repeats %q:\n%s", l, out)
			}
		}
		return nil
	})
}

// TestStatusSaysATargetIsDown: a Tunnel whose target refuses connections
// makes status not ready, naming the Tunnel, the exit, the target and the
// error, and exit 1 (clients are accepted, then reset); once the target
// listens again, status says so without a flow having to pass first. probe
// exits 1 while the target refuses, saying so. A manifest with an error
// does not keep status from asking the relays.
func TestStatusSaysATargetIsDown(t *testing.T) {
	bin := procs.Hoplink(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	go testutil.ServeSinkThenSource(ln)
	n := procs.StartNet(t, bin, target, nil, "{entry: hk, exit: la, route: [hk, la]}")
	if out, err := exec.Command(bin, "cert", "observer", "--certs", n.Certs).CombinedOutput(); err != nil {
		t.Fatalf("cert observer: %v\n%s", err, out)
	}
	status := func() (*observe.Report, error) {
		out, err := exec.Command(bin, "status", "-o", "json", "-f", n.File, "--certs", n.Certs).CombinedOutput()
		var r observe.Report
		if i := strings.LastIndex(string(out), "}"); i < 0 || json.Unmarshal(out[:i+1], &r) != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		return &r, err
	}
	if out, err := exec.Command(bin, "status", "--wait", "--wait-timeout", "30s", "-f", n.File, "--certs", n.Certs).CombinedOutput(); err != nil {
		t.Fatalf("status --wait: %v\n%s", err, out)
	}
	ln.Close() // refused until it listens again
	// The client is reset (at once, or after it connected).
	if c, err := net.Dial("tcp", n.Listen); err == nil {
		c.Write([]byte("hello"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a flow to a refusing target got an answer")
		}
		c.Close()
	}
	r, err := status()
	want := fmt.Sprintf("tunnel default/t: its exit la cannot connect to the target %s", target)
	if err == nil || r.Ready || !strings.Contains(strings.Join(r.NotReady, "\n"), want) || !strings.Contains(strings.Join(r.NotReady, "\n"), "connection refused") {
		t.Errorf("status after a refused flow: exit %v, ready %v, %q; want exit 1 and %q", err, r.Ready, r.NotReady, want)
	}
	// probe says which part failed and why, and exits 1.
	out, err := exec.Command(bin, "probe", "c", "-f", n.File, "--certs", n.Certs).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connection refused") || !strings.Contains(string(out), "part(s) of chain default/c failed: target "+target) {
		t.Errorf("probe with the target down: exit %v\n%s", err, out)
	}
	back, err := net.Listen("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	testutil.WaitFor(t, "status ready once the target listens", func() error {
		r, err := status()
		if err != nil || !r.Ready {
			return fmt.Errorf("exit %v: %v", err, r.NotReady)
		}
		return nil
	})
	if out, err := exec.Command(bin, "probe", "c", "-f", n.File, "--certs", n.Certs).CombinedOutput(); err != nil {
		t.Errorf("probe with the target back: exit %v\n%s", err, out)
	}

	// A typo in the manifests (which the relays would refuse on reload,
	// keeping what they run): status asks the relays it can read of, and
	// says what it skipped.
	good, err := os.ReadFile(n.File)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, append(good, []byte("---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: typo}\nspec: {chain: c, listen: {port: 1}, targte: \"x:1\"}\n")...), 0o600)
	out, err = exec.Command(bin, "status", "-f", bad, "--certs", n.Certs).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "the manifests do not load") || !strings.Contains(string(out), "targte") || !strings.Contains(string(out), "ready: every relay answers") {
		t.Errorf("status with a typo in the manifests: exit %v\n%s", err, out)
	}
}

// probe without a CHAIN, or with two, lists the chains of the -f
// manifests to choose from and how to give one; it said "accepts 1
// arg(s), received 0".
func TestProbeArgumentErrorsListTheChains(t *testing.T) {
	for _, args := range [][]string{
		{"probe", "-f", "../../examples/local", "--certs", t.TempDir()},
		{"probe", "fastest", "to-east", "-f", "../../examples/local", "--certs", t.TempDir()},
	} {
		_, err := execute(args...)
		if err == nil {
			t.Fatalf("%v: no error", args)
		}
		for _, want := range []string{"CHAIN", "to-east", "fastest", "hoplink probe "} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: %q does not say %q", args, err, want)
			}
		}
	}
	if _, err := execute("probe"); err == nil || !strings.Contains(err.Error(), "-f FILE_OR_DIR") {
		t.Errorf("probe without -f: %v, want how to name the manifests", err)
	}
}
