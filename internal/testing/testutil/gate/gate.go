// Package gate ends a test that this machine cannot run: a skip where a
// tool or a privilege is missing, except under CI (CI set, as .ci/run
// does), which provides them all, so that a skip there would hide a test
// that no longer runs anywhere. It imports nothing of ours, so that any
// test may use it, a package's own internal tests too. Tests only.
package gate

import (
	"fmt"
	"os"
	"testing"
)

// InCI says whether the tests run under CI.
func InCI() bool { return os.Getenv("CI") != "" }

// Missing ends t for what this machine lacks (a tool, root, a kernel
// feature): a skip, or under CI a failure.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("%s (CI provides it: CI=%s)", why, os.Getenv("CI"))
	}
	// skip-ok: the one skip that fails under CI.
	t.Skip(why)
}
