package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBundleOf(t *testing.T) {
	for _, tc := range []struct {
		args string
		want string
	}{
		{"--root /run/runc create --bundle /b id", "/b"},
		{"create -b /b id", "/b"},
		{"run --bundle=/b id", "/b"},
		{"create id", "."},
		{"start id", ""},
		{"--log /l delete id", ""},
	} {
		if got := bundleOf(strings.Fields(tc.args)); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.args, got, tc.want)
		}
	}
}

func TestFix(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(p, []byte(`{"ociVersion":"1.0.2","process":{"oomScoreAdj":-998,"capabilities":{"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE"],"effective":["CAP_SYS_RESOURCE"]},"args":["sh"]}}`), 0o644)
	if err := fix(p, true); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	s := string(b)
	if strings.Contains(s, "SYS_RESOURCE") || strings.Contains(s, "oomScoreAdj") || !strings.Contains(s, "CAP_CHOWN") || !strings.Contains(s, `"args":["sh"]`) {
		t.Fatalf("fixed spec: %s", s)
	}
}

func TestExecProcess(t *testing.T) {
	if got := processOf(strings.Fields("--root /r exec --process /tmp/p.json id")); got != "/tmp/p.json" {
		t.Errorf("processOf: %q", got)
	}
	if got := processOf(strings.Fields("create --bundle /b id")); got != "" {
		t.Errorf("processOf of create: %q", got)
	}
	p := filepath.Join(t.TempDir(), "process.json")
	os.WriteFile(p, []byte(`{"args":["ctr"],"capabilities":{"bounding":["CAP_SYS_RESOURCE","CAP_NET_ADMIN"]}}`), 0o644)
	if err := fix(p, false); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if strings.Contains(string(b), "SYS_RESOURCE") || !strings.Contains(string(b), "CAP_NET_ADMIN") {
		t.Fatalf("fixed process: %s", b)
	}
}
