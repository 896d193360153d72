package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commands is every command a user can run, cobra's help and completion
// commands included, as the tree Execute builds.
func commands() []*cobra.Command {
	root := newRoot()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var out []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		out = append(out, c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return out
}

// ours says whether c is hoplink's, not one cobra adds.
func ours(c *cobra.Command) bool {
	for p := c; p != nil; p = p.Parent() {
		if p.Parent() != nil && p.Parent().Parent() == nil && (p.Name() == "completion" || p.Name() == "help") {
			return false
		}
	}
	return true
}

// valueName is a placeholder: capitals, with ":", "/", "-" and "[]" for
// its parts (HOST:PORT, [ADDR:]PORT, NAMESPACE/NAME, FIRST-LAST).
var valueName = regexp.MustCompile(`^[A-Z\[][A-Z0-9_:/\-\[\]]*$`)

// pflag takes the first `quoted` word of a flag's usage as the name of
// its value, so a command quoted there showed as the value's name
// (`--observer-certs hoplink status --certs DIR`). A quoted word must be
// a placeholder in capitals, and commands' texts quote nothing.
func TestFlagHelpNamesValues(t *testing.T) {
	for _, c := range commands() {
		check := func(f *pflag.Flag) {
			name, usage := pflag.UnquoteUsage(f)
			if strings.Contains(f.Usage, "`") && !valueName.MatchString(name) {
				t.Errorf("%s --%s: help shows %q as the value's name; quote only a placeholder such as `DIR`", c.CommandPath(), f.Name, name)
			}
			if strings.Contains(usage, "`") {
				t.Errorf("%s --%s: help shows a backtick: %q", c.CommandPath(), f.Name, usage)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		if !ours(c) {
			continue
		}
		for what, s := range map[string]string{"Use": c.Use, "Short": c.Short, "Long": c.Long, "Example": c.Example} {
			if strings.Contains(s, "`") {
				t.Errorf("%s: %s shows backticks as they are: %q", c.CommandPath(), what, s)
			}
		}
	}
}

// A text flag's help names what its value is (FILE, DIR, ADDR, FORMAT),
// never its Go type: "--kubeconfig string" beside "--ca FILE" told the
// reader nothing.
func TestTextFlagsHavePlaceholders(t *testing.T) {
	for _, c := range commands() {
		if !ours(c) {
			continue
		}
		check := func(f *pflag.Flag) {
			if typ := f.Value.Type(); typ != "string" && typ != "stringSlice" {
				return
			}
			if name, _ := pflag.UnquoteUsage(f); name == "string" || name == "strings" {
				t.Errorf("%s --%s: help shows %q for its value; quote a placeholder in its usage, such as `FILE`", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
	}
}

// Renamed flags answer to their old names for a release, say so, and are
// out of help: one name per concept, without breaking scripts and pods of
// the last version.
func TestRenamedFlagsKeepTheirOldNames(t *testing.T) {
	dir := t.TempDir()
	out, err := execute("cert", "ca", "--dir", dir)
	if err != nil || !strings.Contains(out, dir+"/ca.key") {
		t.Fatalf("cert ca --dir: %q, %v", out, err)
	}
	if !strings.Contains(out, "Flag --dir has been deprecated, use --certs instead") {
		t.Errorf("cert ca --dir printed no notice: %q", out)
	}
	// --relaynode sets what --name does: the error names the relay given.
	out, err = execute("relay", "-f", "../../examples/local", "--relaynode", "seatle")
	if err == nil || !strings.Contains(err.Error(), `--name "seatle"`) {
		t.Errorf("relay --relaynode: %v", err)
	}
	if !strings.Contains(out, "Flag --relaynode has been deprecated, use --name instead") {
		t.Errorf("relay --relaynode printed no notice: %q", out)
	}
	out, err = execute("operator", "--metrics-bind-address", ":0", "--privileged-relays", "all")
	if err == nil || !strings.Contains(err.Error(), "--privileged-relays") || !strings.Contains(out, "Flag --metrics-bind-address has been deprecated, use --metrics-addr instead") {
		t.Errorf("operator --metrics-bind-address: %q, %v", out, err)
	}
	for _, c := range commands() {
		for old, current := range map[string]string{"dir": "certs", "relaynode": "name", "metrics-bind-address": "metrics-addr",
			"health-probe-bind-address": "health-probe-addr", "pprof-bind-address": "pprof-addr"} {
			f := c.LocalFlags().Lookup(old)
			if f == nil {
				continue
			}
			if f.Deprecated == "" || c.LocalFlags().Lookup(current) == nil || f.Value != c.LocalFlags().Lookup(current).Value {
				t.Errorf("%s --%s: not a deprecated alias of --%s", c.CommandPath(), old, current)
			}
			if strings.Contains(c.UsageString(), "--"+old+" ") {
				t.Errorf("%s: help lists --%s", c.CommandPath(), old)
			}
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/help from the commands' help")

// TestHelp holds every command's help (what --help prints) to
// testdata/help, so a change to a flag or text shows in review.
// go test ./cmd/hoplink -run TestHelp -update rewrites the files.
func TestHelp(t *testing.T) {
	t.Setenv("HOPLINK_RELAY_IMAGE", "") // the operator's --relay-image default
	dir := filepath.Join("testdata", "help")
	want := map[string]bool{}
	for _, c := range commands() {
		if c.Hidden {
			continue
		}
		path := strings.Fields(c.CommandPath())[1:]
		file := strings.Join(append([]string{"hoplink"}, path...), "_") + ".txt"
		want[file] = true
		got, err := execute(append(path, "--help")...)
		if err != nil {
			t.Fatalf("%s --help: %v", c.CommandPath(), err)
		}
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, file), []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		golden, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Errorf("%s: %v (run go test ./cmd/hoplink -run TestHelp -update)", c.CommandPath(), err)
			continue
		}
		if got != string(golden) {
			t.Errorf("%s --help differs from %s (run go test ./cmd/hoplink -run TestHelp -update, and review the diff):\n%s",
				c.CommandPath(), filepath.Join(dir, file), lineDiff(string(golden), got))
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !want[e.Name()] {
			if *update {
				os.Remove(filepath.Join(dir, e.Name()))
				continue
			}
			t.Errorf("%s: no command has this help (run with -update to remove it)", filepath.Join(dir, e.Name()))
		}
	}
}

// lineDiff lists the lines of want and got that differ, by position.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("- " + a + "\n+ " + c + "\n")
		}
	}
	return b.String()
}

// A flag the usage line writes outside brackets reads as one to give; a
// flag with a default is not, so its usage line brackets it.
func TestUsageLinesBracketFlagsWithDefaults(t *testing.T) {
	for _, c := range commands() {
		if !ours(c) {
			continue
		}
		depth := 0
		var word strings.Builder
		check := func() {
			w := word.String()
			word.Reset()
			var f *pflag.Flag
			switch {
			case strings.HasPrefix(w, "--"):
				f = c.Flags().Lookup(strings.TrimPrefix(w, "--"))
			case strings.HasPrefix(w, "-") && len(w) == 2:
				f = c.Flags().ShorthandLookup(w[1:])
			}
			if f != nil && f.DefValue != "" && f.DefValue != "[]" && f.DefValue != "false" {
				t.Errorf("%s: the usage line %q writes %s as required, but it defaults to %q: write [%s ...]", c.CommandPath(), c.Use, w, f.DefValue, w)
			}
		}
		for _, r := range c.Use {
			switch {
			case r == '[':
				check()
				depth++
			case r == ']':
				depth--
			case r == ' ' || r == '(' || r == ')' || r == '|':
				check()
			case depth == 0:
				word.WriteRune(r)
			}
		}
		check()
	}
}

// Every command a user runs has an example, and each example's command
// line names a command and flags that exist, with as many arguments as
// the command takes.
func TestEveryCommandHasExamplesThatParse(t *testing.T) {
	for _, c := range commands() {
		if !ours(c) || !c.Runnable() && c.Parent() == nil {
			continue
		}
		if c.Example == "" {
			t.Errorf("%s: no Example", c.CommandPath())
			continue
		}
		for _, line := range strings.Split(c.Example, "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "hoplink ") {
				continue
			}
			// The shell's part (a pipe, a redirection) is not hoplink's.
			if i := strings.IndexAny(line, "|>"); i >= 0 {
				line = strings.TrimSpace(line[:i])
			}
			root := newRoot()
			cmd, rest, err := root.Find(strings.Fields(line)[1:])
			if err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				continue
			}
			if cmd.Args != nil {
				if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
					t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				}
			}
		}
	}
}
