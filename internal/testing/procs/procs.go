// Package procs runs the hoplink binary for tests that start it as a
// process: the binary built once per test process, commands that must
// succeed, the files a relay reads, and relay processes on loopback. Tests
// only.
package procs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// binDir holds the binary Hoplink built, for Main to remove.
var binDir string

var build = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "hoplink-test-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "hoplink")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/hoplink/hoplink/cmd/hoplink").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return bin, nil
})

// Hoplink is the path of a hoplink binary built from this checkout. The
// first test of the process that asks builds it; every later one gets the
// same file, so that a package's tests link the binary once. The package
// removes it in TestMain, with Main.
func Hoplink(t testing.TB) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Main runs a package's tests and removes the binary Hoplink built, if a
// test asked for it. A package whose tests call Hoplink has
//
//	func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// Run runs a command and fails the test, with its output, if it fails.
func Run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// RelayFiles writes a manifest into dir and makes a CA with certificates
// for the named relays, as a user would before starting relay processes;
// it returns the certificate directory.
func RelayFiles(t testing.TB, bin, dir, file, manifest string, relays ...string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	Run(t, bin, "cert", "ca", "--certs", certs)
	Run(t, append([]string{bin, "cert", "issue", "--certs", certs}, relays...)...)
	return certs
}

// Start starts bin with args, its output into the file logf; it is killed
// if the test process dies. Stopping it is the caller's.
func Start(t testing.TB, logf, bin string, args ...string) *exec.Cmd {
	t.Helper()
	out, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// waits holds one Wait per process: a test and its cleanup may both wait
// for a relay, and exec.Cmd.Wait must not run twice at once.
var waits sync.Map // *exec.Cmd -> func() error

// Wait waits for c to exit; every caller gets the same result.
func Wait(c *exec.Cmd) error {
	w, _ := waits.LoadOrStore(c, sync.OnceValue(c.Wait))
	return w.(func() error)()
}
