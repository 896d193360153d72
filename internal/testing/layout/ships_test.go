package layout

import (
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// misnamed returns the packages under internal/ whose folder says the
// wrong thing of them: one under internal/testing/ that the binary links
// (its code ships), and one elsewhere under internal/ that it does not
// (only tests or tools use it, so it belongs under internal/testing/).
func misnamed(pkgs []string, linked map[string]bool) []string {
	var bad []string
	for _, pkg := range pkgs {
		switch {
		case matches("internal/testing/...", pkg) && linked[pkg]:
			bad = append(bad, fmt.Sprintf("%s is linked into the binary: what ships lives in internal/, not internal/testing/", pkg))
		case matches("internal/...", pkg) && !matches("internal/testing/...", pkg) && !linked[pkg]:
			bad = append(bad, fmt.Sprintf("%s is not linked into the binary: what only tests use lives under internal/testing/", pkg))
		}
	}
	slices.Sort(bad)
	return bad
}

// linkedByTheBinary is our packages cmd/hoplink depends on.
func linkedByTheBinary(t *testing.T) map[string]bool {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "./cmd/hoplink")
	cmd.Dir = "../../.."
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	linked := map[string]bool{}
	for _, dep := range strings.Fields(string(b)) {
		if p, ok := strings.CutPrefix(dep, module+"/"); ok {
			linked[p] = true
		}
	}
	return linked
}

// TestInternalSaysWhatShips: internal/ holds what the binary links and
// internal/testing/ what only tests use, so that a folder's name says
// whether its code ships.
func TestInternalSaysWhatShips(t *testing.T) {
	for _, v := range misnamed(slices.Collect(maps.Keys(imports(t, false))), linkedByTheBinary(t)) {
		t.Error(v)
	}
}

// TestMisnamedCatchesThem: a test helper the binary links and a shipping
// folder only tests use are reported; neither the rest of internal/ nor
// packages outside it are.
func TestMisnamedCatchesThem(t *testing.T) {
	pkgs := []string{"internal/logs", "internal/testing/testutil", "internal/testing/leak", "internal/unused", "relay", "hack/bench/x"}
	linked := map[string]bool{"internal/logs": true, "internal/testing/leak": true, "relay": true}
	want := []string{
		"internal/testing/leak is linked into the binary: what ships lives in internal/, not internal/testing/",
		"internal/unused is not linked into the binary: what only tests use lives under internal/testing/",
	}
	if bad := misnamed(pkgs, linked); !slices.Equal(bad, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
}
