package main

import (
	"bytes"
	"encoding/json"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/procs"
)

// The tests that run the binary share one build of it (procs.Hoplink).
func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }

func execute(args ...string) (string, error) {
	cmd := newRoot()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestCertCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if out, err := execute("cert", "ca", "--certs", dir); err != nil || !strings.Contains(out, "ca.key") {
		t.Fatalf("cert ca: %q, %v", out, err)
	}
	if _, err := execute("cert", "issue", "--certs", dir, "hk", "la"); err != nil {
		t.Fatalf("cert issue: %v", err)
	}
	if _, err := execute("cert", "issue", "--certs", dir, "Not_A_Name"); err == nil || !strings.Contains(err.Error(), "relay name") {
		t.Fatalf("cert issue accepted an invalid relay name: %v", err)
	}
	if _, err := execute("cert", "ca", "--certs", dir); err == nil {
		t.Fatal("cert ca overwrote an existing CA")
	}
}

func TestRelayFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "-f", "x.yaml"}, "--name: required"},
		{[]string{"relay", "-f", "../../examples/local", "--name", "hk"}, "give --certs DIR"},
		{[]string{"relay", "-f", "../../examples/local", "--name", "seatle", "--certs", "does-not-exist"}, `--name "seatle": no RelayNode of that name in the manifests (they have: hk, seattle, la); did you mean "seattle"?`},
		{[]string{"relay", "--name", "hk", "--certs", "c"}, "-f: name at least one manifest"},
		{[]string{"local"}, "-f: name at least one manifest"},
		{[]string{"local", "-f", "does-not-exist"}, "does-not-exist"},
		{[]string{"local", "-f", "../../examples/local", "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"operator", "--relay-resources", `{"requests":{"cpu":"lots"}}`}, "--relay-resources"},
		{[]string{"operator", "--relay-resources", `{"request":{"cpu":"1"}}`}, `unknown field "request"`},
		{[]string{"operator", "--privileged-relays", "all"}, `--privileged-relays "all": want namespace-label`},
		{[]string{"operator", "--watch-namespaces", "edge", "--webhook-port", "0"}, "use --privileged-relays=any"},
		{[]string{"operator", "--watch-namespaces", "edge", "--privileged-relays", "any"}, "use --webhook-port=0"},
	} {
		_, err := execute(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to say %q", tc.args, err, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	out, err := execute("version")
	if err != nil || !strings.HasPrefix(out, "hoplink ") {
		t.Fatalf("version: %q, %v", out, err)
	}
	for _, flag := range []string{"--version", "-v"} {
		if got, err := execute(flag); err != nil || got != out {
			t.Errorf("hoplink %s: %q, %v; want what hoplink version prints, %q", flag, got, err, out)
		}
	}
}

// A binary built by 'go install module@version' has no -X main.version;
// it reports the module version Go recorded, and a build of a checkout
// with neither says dev.
func TestBuildVersion(t *testing.T) {
	info := func(v string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Main: debug.Module{Version: v}}, true }
	}
	for _, tc := range []struct {
		set, module, want string
	}{
		{"v1.4.0", "v1.3.0", "v1.4.0"},
		{"dev", "v1.3.0", "v1.3.0"},
		{"dev", "(devel)", "dev"},
		{"dev", "", "dev"},
	} {
		if got := buildVersion(tc.set, info(tc.module)); got != tc.want {
			t.Errorf("set %q, module %q: %q, want %q", tc.set, tc.module, got, tc.want)
		}
	}
}

// Lines libraries print through the standard logger (quic-go's buffer
// warning) come out as the process's own warnings, in its format.
func TestStandardLogGoesThroughTheLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := (&logFlags{level: "info", format: "json"}).loggerTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	std := log.New(stdLog{l}, "", 0)
	std.Printf("failed to sufficiently increase receive buffer size (was: 208 kiB, wanted: 7168 kiB, got: 416 kiB).")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q", buf.String())
	}
	if rec["level"] != "WARN" || !strings.HasPrefix(rec["msg"].(string), "failed to sufficiently increase receive buffer size") {
		t.Errorf("record %v", rec)
	}
}

// A standalone relay given local mode's link emulation says it leaves it
// alone, rather than silently measuring other round trips than the file says.
func TestRelaySaysItLeavesLinkEmulationAlone(t *testing.T) {
	bin := procs.Hoplink(t)
	out, err := exec.Command(bin, "relay", "-f", "../../examples/local", "--name", "hk").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "give --certs DIR") {
		t.Fatalf("relay without certificates: %v\n%s", err, out)
	}
	for _, rn := range []string{"hk", "seattle"} {
		if want := `msg="annotation left alone here: only 'hoplink local' emulates links; these have real round trips" relaynode=` + rn + ` annotation=hoplink.dev/local-rtt`; !strings.Contains(string(out), want) {
			t.Errorf("no line %s in\n%s", want, out)
		}
	}
}

// Every command checks the log flags, those that log nothing too:
// 'cert show' and 'version' took --log-format jsn without a word.
func TestEveryCommandChecksLogFlags(t *testing.T) {
	certs := t.TempDir()
	for _, args := range [][]string{
		{"version"},
		{"cert", "show", "--certs", certs},
		{"cert", "ca", "--certs", certs},
		{"status", "-f", "../../examples/local", "--certs", certs},
		{"probe", "fastest", "-f", "../../examples/local", "--certs", certs},
	} {
		for flag, want := range map[string]string{"--log-format=jsn": `--log-format "jsn": use text or json`, "--log-level=loud": `--log-level "loud"`} {
			_, err := execute(append(args, flag)...)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%v %s: %v, want %q", args, flag, err, want)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(certs, "ca.key")); err == nil {
		t.Error("cert ca made a CA before it refused its flags")
	}
}
