package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

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
	if out, err := execute("cert", "ca", "--dir", dir); err != nil || !strings.Contains(out, "ca.key") {
		t.Fatalf("cert ca: %q, %v", out, err)
	}
	if _, err := execute("cert", "issue", "--dir", dir, "hk", "la"); err != nil {
		t.Fatalf("cert issue: %v", err)
	}
	if _, err := execute("cert", "issue", "--dir", dir, "Not_A_Name"); err == nil || !strings.Contains(err.Error(), "relay name") {
		t.Fatalf("cert issue accepted an invalid relay name: %v", err)
	}
	if _, err := execute("cert", "ca", "--dir", dir); err == nil {
		t.Fatal("cert ca overwrote an existing CA")
	}
}

func TestRelayFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "-f", "x.yaml"}, "--name: required"},
		{[]string{"relay", "-f", "x.yaml", "--name", "hk"}, "give --certs DIR"},
		{[]string{"relay", "--name", "hk", "--certs", "c"}, "-f: name at least one manifest"},
		{[]string{"local"}, "-f: name at least one manifest"},
		{[]string{"local", "-f", "does-not-exist"}, "does-not-exist"},
		{[]string{"local", "-f", "../../examples/local", "--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"operator", "--relay-resources", `{"requests":{"cpu":"lots"}}`}, "--relay-resources"},
		{[]string{"operator", "--relay-resources", `{"request":{"cpu":"1"}}`}, `unknown field "request"`},
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
}
