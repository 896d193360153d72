package layout

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A test that skips where a tool or a privilege is missing would skip in
// CI too, had CI lost it, and hide itself there: such a test calls
// gate.Missing (internal/testing/testutil/gate), which fails under CI. A skip that
// is right everywhere, CI included (-short, a child process's helper, a
// size not run by design), says why on the line before it, or at its end:
//
//	// skip-ok: REASON
const skipOK = "skip-ok:"

// skipMethods are testing.TB's: a call of any, or a method value (skip :=
// t.Skip) that a later call hides, must carry skipOK.
var skipMethods = []string{"Skip", "Skipf", "SkipNow"}

// badSkips returns the skips of a file that carry no reason, as
// "path:line: ...". Only files that import "testing" can reach a
// testing.TB, so the others (a decoder's Skip) are left alone.
func badSkips(fset *token.FileSet, f *ast.File) []string {
	if !slices.ContainsFunc(f.Imports, func(s *ast.ImportSpec) bool { return s.Path.Value == strconv.Quote("testing") }) {
		return nil
	}
	// The lines a reason covers: its own and the next.
	covered := map[int]bool{}
	for _, g := range f.Comments {
		for _, c := range g.List {
			text := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
			if why, ok := strings.CutPrefix(text, skipOK); ok && strings.TrimSpace(why) != "" {
				line := fset.Position(c.Slash).Line
				covered[line], covered[line+1] = true, true
			}
		}
	}
	var bad []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || !slices.Contains(skipMethods, sel.Sel.Name) {
			return true
		}
		at := fset.Position(sel.Sel.Pos())
		if !covered[at.Line] {
			bad = append(bad, fmt.Sprintf("%s:%d: %s with no reason: call gate.Missing (a failure under CI) or say why it is right everywhere with // %s REASON on the line before",
				at.Filename, at.Line, sel.Sel.Name, skipOK))
		}
		return true
	})
	return bad
}

// goFiles lists the module's Go files under root, whatever their build
// tags: not testdata, hidden directories or another module's.
func goFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSkipsFailUnderCIOrSayWhy(t *testing.T) {
	fset := token.NewFileSet()
	files := goFiles(t, "../../..")
	if len(files) < 100 {
		t.Fatalf("found %d Go files in the module", len(files))
	}
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range badSkips(fset, f) {
			t.Error(strings.TrimPrefix(v, "../../../"))
		}
	}
}

// TestSkipCheckCatchesThem: a bare skip of each kind, one hidden in a
// method value, and reasons that are empty, too far above, or not the
// marker are reported; a reason on the line before or at the end of the
// line, gate.Missing, and a file without "testing" are not.
func TestSkipCheckCatchesThem(t *testing.T) {
	const src = `package x

import "testing"

func TestX(t *testing.T) {
	t.Skip("no tool")                 // line 6
	t.Skipf("no %s", "tool")          // line 7
	t.SkipNow()                       // line 8
	skip := t.Skip                    // line 9
	skip("hidden")
	// skip-ok:
	t.Skip("an empty reason")         // line 12
	// skip-ok: too far above

	t.Skip("a blank line between")    // line 15
	// skip: not the marker
	t.Skip("another marker")          // line 17
	if testing.Short() {
		// skip-ok: -short, in CI too.
		t.Skip("-short")
	}
	t.Skip("-short") // skip-ok: the same, at the end of the line.
	gate.Missing(t, "no tool")
}

func BenchmarkX(b *testing.B) {
	b.Skipf("too big")                // line 27
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, v := range badSkips(fset, f) {
		file, rest, _ := strings.Cut(v, ":")
		line, _, _ := strings.Cut(rest, ":")
		if file != "x_test.go" {
			t.Errorf("reported as %s, want x_test.go: %s", file, v)
		}
		lines = append(lines, line)
	}
	if want := []string{"6", "7", "8", "9", "12", "15", "17", "27"}; !slices.Equal(lines, want) {
		t.Errorf("reported lines %v, want %v", lines, want)
	}

	noTesting := strings.Replace(src, `import "testing"`, `import "encoding/xml"`, 1)
	f, err = parser.ParseFile(fset, "decoder.go", noTesting, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	if bad := badSkips(fset, f); len(bad) > 0 {
		t.Errorf("a file without testing: %v", bad)
	}
}
