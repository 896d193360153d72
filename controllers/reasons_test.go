package controllers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Every condition and Event reason has a section in the troubleshooting
// page, every section is a reason, and no reason is written as a literal
// outside reasons.go (where this test could not see it).
func TestEveryReasonIsDocumented(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "reasons.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if v, ok := n.(*ast.ValueSpec); ok {
			for _, val := range v.Values {
				if lit, ok := val.(*ast.BasicLit); ok {
					s, _ := strconv.Unquote(lit.Value)
					reasons[s] = true
				}
			}
		}
		return true
	})
	doc, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^### (\w+)$`).FindAllStringSubmatch(string(doc), -1) {
		sections[m[1]] = true
	}
	for r := range reasons {
		if !sections[r] {
			t.Errorf("reason %s has no section in docs/troubleshooting.md", r)
		}
	}
	for s := range sections {
		if !reasons[s] {
			t.Errorf("docs/troubleshooting.md has a section %s, which is no reason of controllers/reasons.go", s)
		}
	}
	literal := regexp.MustCompile(`Reason: "|Reason = metav1\.Condition\w+, "|refusal\{"|event\([^)]*, "[A-Z]`)
	files, _ := filepath.Glob("*.go")
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "reasons.go" {
			continue
		}
		b, _ := os.ReadFile(name)
		if loc := literal.FindIndex(b); loc != nil {
			t.Errorf("%s writes a reason as a literal near %q: use a constant of reasons.go", name, b[loc[0]:min(len(b), loc[1]+20)])
		}
	}
}

// Relays leave out a RelayNode whose Ready reason is the API's
// NameConflict (manifest.HeldNames), so it is the one the operator writes.
func TestNameConflictIsTheReasonRelaysRead(t *testing.T) {
	if ReasonNameConflict != v1alpha1.ReasonNameConflict {
		t.Fatalf("the operator writes %q, relays look for %q", ReasonNameConflict, v1alpha1.ReasonNameConflict)
	}
}
