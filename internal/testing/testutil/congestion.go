package testutil

import (
	"os"
	"slices"
	"strings"
	"testing"
)

const allowedCongestion = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"

// AllowCongestion adds algorithms to the host's
// net.ipv4.tcp_allowed_congestion_control until the test ends: a network
// namespace may take as its default only one listed there, and the list
// is the host's, one for every namespace. Needs root.
func AllowCongestion(t testing.TB, names ...string) {
	t.Helper()
	old, err := os.ReadFile(allowedCongestion)
	if err != nil {
		t.Fatal(err)
	}
	list := strings.Fields(string(old))
	for _, n := range names {
		if !slices.Contains(list, n) {
			list = append(list, n)
		}
	}
	if err := os.WriteFile(allowedCongestion, []byte(strings.Join(list, " ")), 0); err != nil {
		t.Fatalf("allowing %v: %v", names, err)
	}
	t.Cleanup(func() { os.WriteFile(allowedCongestion, old, 0) })
}
