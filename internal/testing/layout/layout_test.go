package layout

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/hoplink/hoplink"

// rule is a row of the Layout table: the package (or, ending in /...,
// the tree of packages) and what it may import of ours.
type rule struct {
	pkg   string
	any   bool     // "any": everything
	allow []string // entries, "x/..." for a tree
}

func (r rule) covers(pkg string) bool { return matches(r.pkg, pkg) }

func (r rule) allows(imp string) bool {
	if r.any {
		return true
	}
	for _, a := range r.allow {
		if matches(a, imp) {
			return true
		}
	}
	return false
}

func matches(pattern, pkg string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == tree || strings.HasPrefix(pkg, tree+"/")
	}
	return pattern == pkg
}

var code = regexp.MustCompile("`([^`]+)`")

// rules reads the Layout table of docs/architecture.md.
func rules(t *testing.T, doc string) []rule {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []rule
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Layout"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s: a Layout row needs 3 cells (path, holds, may import): %q", doc, line)
		}
		may := strings.TrimSpace(cells[2])
		for _, p := range code.FindAllStringSubmatch(cells[0], -1) {
			r := rule{pkg: p[1]}
			switch may {
			case "any":
				r.any = true
			case "—":
			default:
				for _, m := range code.FindAllStringSubmatch(may, -1) {
					r.allow = append(r.allow, m[1])
				}
				if len(r.allow) == 0 {
					t.Fatalf("%s: row %q: may import must be —, any, or `packages`", doc, line)
				}
			}
			out = append(out, r)
		}
	}
	if len(out) < 10 {
		t.Fatalf("%s: found %d Layout rows", doc, len(out))
	}
	return out
}

// imports lists our packages and the packages of ours each imports, e2e
// included; tests are left out (they may reach for whatever they test with)
// unless withTests.
func imports(t *testing.T, withTests bool) map[string][]string {
	t.Helper()
	format := "{{.ImportPath}} {{join .Imports \" \"}}"
	if withTests {
		format += " {{join .TestImports \" \"}} {{join .XTestImports \" \"}}"
	}
	out := map[string][]string{}
	for _, tags := range []string{"", "e2e"} {
		cmd := exec.Command("go", "list", "-tags", tags, "-f", format, "./...")
		cmd.Dir = "../../.."
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			pkg, ok := strings.CutPrefix(f[0], module+"/")
			if !ok {
				continue
			}
			var ours []string
			for _, imp := range f[1:] {
				if p, ok := strings.CutPrefix(imp, module+"/"); ok {
					ours = append(ours, p)
				}
			}
			// An external test package imports the package it tests.
			ours = slices.DeleteFunc(ours, func(p string) bool { return p == pkg })
			out[pkg] = ours
		}
	}
	return out
}

// check returns the violations of the rules by the import graph.
func check(rs []rule, graph map[string][]string) []string {
	var bad []string
	for pkg, imps := range graph {
		var r *rule
		for i := range rs {
			if rs[i].covers(pkg) && (r == nil || len(rs[i].pkg) > len(r.pkg)) {
				r = &rs[i]
			}
		}
		if r == nil {
			bad = append(bad, fmt.Sprintf("%s has no row in the Layout table of docs/architecture.md", pkg))
			continue
		}
		for _, imp := range imps {
			if !r.allows(imp) {
				bad = append(bad, fmt.Sprintf("%s imports %s, which its row (%s) does not allow", pkg, imp, r.pkg))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// stale returns the rows that name no package of the graph: a path that
// is no package, or a tree with none in it.
func stale(rs []rule, graph map[string][]string) []string {
	var bad []string
	for _, r := range rs {
		found := false
		for pkg := range graph {
			found = found || r.covers(pkg)
		}
		if !found {
			bad = append(bad, fmt.Sprintf("docs/architecture.md has a row for %s, which is no package", r.pkg))
		}
	}
	slices.Sort(bad)
	return bad
}

// intoHack returns the imports of hack/ from packages outside it: hack/
// holds scripts, benchmark commands and generators, and whatever others
// share lives in internal/testing/.
func intoHack(graph map[string][]string) []string {
	var bad []string
	for pkg, imps := range graph {
		if matches("hack/...", pkg) {
			continue
		}
		for _, imp := range imps {
			if matches("hack/...", imp) {
				bad = append(bad, fmt.Sprintf("%s imports %s: nothing outside hack/ may import it", pkg, imp))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func TestImportsFollowTheLayout(t *testing.T) {
	rs := rules(t, "../../../docs/architecture.md")
	graph := imports(t, false)
	for _, v := range check(rs, graph) {
		t.Error(v)
	}
	for _, v := range stale(rs, graph) {
		t.Error(v)
	}
}

// TestNothingOutsideHackImportsHack holds tests to it too: a helper that
// tests share is no benchmark's.
func TestNothingOutsideHackImportsHack(t *testing.T) {
	for _, v := range intoHack(imports(t, true)) {
		t.Error(v)
	}
}

// TestControllersReachNoDataPlane: the operator shares packages with the
// relays, never the data plane itself, not even indirectly.
func TestControllersReachNoDataPlane(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./controllers")
	cmd.Dir = "../../.."
	b, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(b)) {
		if matches(module+"/relay/...", dep) {
			t.Errorf("controllers depends on %s", dep)
		}
	}
}

// TestCheckCatchesAForbiddenImport: the check itself fails on a graph that
// breaks a rule, and on a package the table forgot.
func TestCheckCatchesAForbiddenImport(t *testing.T) {
	rs := []rule{{pkg: "api/v1alpha1"}, {pkg: "controllers", allow: []string{"api/v1alpha1"}}, {pkg: "hack/...", any: true}}
	if bad := check(rs, map[string][]string{"controllers": {"api/v1alpha1"}, "hack/bench/x": {"relay"}}); len(bad) != 0 {
		t.Fatalf("allowed graph refused: %v", bad)
	}
	bad := check(rs, map[string][]string{"controllers": {"relay/flow"}, "api/v1alpha1": {"controllers"}, "relay": nil})
	want := []string{
		"api/v1alpha1 imports controllers, which its row (api/v1alpha1) does not allow",
		"controllers imports relay/flow, which its row (controllers) does not allow",
		"relay has no row in the Layout table of docs/architecture.md",
	}
	if !slices.Equal(bad, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
}

// TestStaleAndHackChecksCatchThem: a row whose package is gone, a tree row
// with nothing under it, and an import of hack/ from outside are reported;
// hack/ importing itself is not.
func TestStaleAndHackChecksCatchThem(t *testing.T) {
	rs := []rule{{pkg: "relay"}, {pkg: "relay/gone"}, {pkg: "hack/bench/..."}, {pkg: "hack/kind/..."}}
	graph := map[string][]string{
		"relay":        {"hack/linkemu"},
		"hack/bench/x": {"hack/seed004"},
	}
	want := []string{
		"docs/architecture.md has a row for hack/kind/..., which is no package",
		"docs/architecture.md has a row for relay/gone, which is no package",
	}
	if bad := stale(rs, graph); !slices.Equal(bad, want) {
		t.Errorf("stale: got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
	want = []string{"relay imports hack/linkemu: nothing outside hack/ may import it"}
	if bad := intoHack(graph); !slices.Equal(bad, want) {
		t.Errorf("intoHack: got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
}
