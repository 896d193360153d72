package gate

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Missing skips outside CI and fails under it, with the reason either
// way: the test runs TestMissingChild in a child process, with and without
// CI set, and reads its verdict.
func TestMissingFailsOnlyUnderCI(t *testing.T) {
	for _, tc := range []struct{ ci, want string }{
		{"", "--- SKIP: TestMissingChild"},
		{"true", "--- FAIL: TestMissingChild"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
		cmd.Env = append(os.Environ(), "CI="+tc.ci, "GATE_CHILD=1")
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "no frobnicator here") {
			t.Errorf("CI=%q: want %q and the reason:\n%s", tc.ci, tc.want, out)
		}
	}
}

// TestMissingChild runs in the child of TestMissingFailsOnlyUnderCI.
func TestMissingChild(t *testing.T) {
	if os.Getenv("GATE_CHILD") == "" {
		return
	}
	Missing(t, "no frobnicator here")
}
