package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// completions runs cobra's hidden completion request, as the shell
// scripts do, and returns the values offered and the directive line.
func completions(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	out, err := execute(append([]string{"__complete"}, args...)...)
	if err != nil {
		t.Fatalf("__complete %v: %v", args, err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var values []string
	directive := ""
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, ":"):
			directive = l
		case strings.HasPrefix(l, "Completion ended"):
		default:
			values = append(values, l)
		}
	}
	return values, directive
}

func TestCompletion(t *testing.T) {
	const ex = "../../examples/local"
	// A manifest still being written: its second document does not
	// decode, and the relay of the first completes all the same.
	partial := filepath.Join(t.TempDir(), "partial.yaml")
	if err := os.WriteFile(partial, []byte("apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: tokyo}\n---\nkind: Chain\nspec: {entry: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const (
		noFiles   = ":4"  // ShellCompDirectiveNoFileComp
		extension = ":8"  // ShellCompDirectiveFilterFileExt
		dirs      = ":16" // ShellCompDirectiveFilterDirs
	)
	for _, tc := range []struct {
		args      []string
		want      []string
		directive string
	}{
		{[]string{"relay", "-f", ex, "--name", ""}, []string{"hk", "seattle", "la"}, noFiles},
		{[]string{"relay", "-f", ex, "--name", "s"}, []string{"seattle"}, noFiles},
		{[]string{"relay", "-f", partial, "--name", ""}, []string{"tokyo"}, noFiles},
		{[]string{"probe", "-f", ex, ""}, []string{"to-east", "fastest"}, noFiles},
		{[]string{"probe", "-f", ex, "-n", "edge", ""}, []string{"default/to-east", "default/fastest"}, noFiles},
		{[]string{"probe", "-f", ex, "to-east", ""}, nil, noFiles},
		{[]string{"cert", "issue", "-f", ex, "hk", ""}, []string{"seattle", "la"}, noFiles},
		{[]string{"status", "-o", ""}, []string{"table", "json", "yaml"}, noFiles},
		{[]string{"local", "--log-level", "w"}, []string{"warn"}, noFiles},
		{[]string{"local", "-f", ""}, []string{"yaml", "yml", "json"}, extension},
		{[]string{"status", "--file", ""}, []string{"yaml", "yml", "json"}, extension},
		{[]string{"relay", "--certs", ""}, nil, dirs},
		{[]string{"cert", "issue", "--certs", ""}, nil, dirs},
		{[]string{"local", "--observer-certs", ""}, nil, dirs},
		{[]string{"relay", "--key", ""}, []string{"key", "pem"}, extension},
	} {
		got, directive := completions(t, tc.args...)
		if !slices.Equal(got, tc.want) || directive != tc.directive {
			t.Errorf("%v: %q %s, want %q %s", tc.args, got, directive, tc.want, tc.directive)
		}
	}
	// Without -f there are no names to offer, and the shell says why.
	if got, _ := completions(t, "relay", "--name", ""); len(got) != 1 || !strings.Contains(got[0], "give -f FILE_OR_DIR first") {
		t.Errorf("relay --name without -f: %q", got)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, err := execute("completion", shell)
		if err != nil || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: %v, %.200q", shell, err, out)
		}
	}
}

func TestCertIssueChecksNamesAgainstManifests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := execute("cert", "ca", "--certs", dir); err != nil {
		t.Fatal(err)
	}
	_, err := execute("cert", "issue", "--certs", dir, "-f", "../../examples/local", "seatle")
	if err == nil || !strings.Contains(err.Error(), `relay name "seatle": no RelayNode of that name in the manifests (they have: hk, seattle, la); did you mean "seattle"?`) {
		t.Errorf("a typo: %v", err)
	}
	if _, err := execute("cert", "issue", "--certs", dir); err == nil || !strings.Contains(err.Error(), "name at least one relay, or give -f") {
		t.Errorf("no names: %v", err)
	}
	out, err := execute("cert", "issue", "--certs", dir, "-f", "../../examples/local")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"hk", "seattle", "la"} {
		if !strings.Contains(out, dir+"/"+n+".crt") {
			t.Errorf("-f without names issued no certificate for %s: %q", n, out)
		}
	}
}
