package linkemu

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// AllowCongestionControl lets namespaces take each of ccs as their default: the kernel
// lets a namespace other than the host's default only to an algorithm of
// the host's allowed list. It returns what puts the list back.
func AllowCongestionControl(ccs []string) (restore func(), err error) {
	const allowed = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
	avail, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if err != nil {
		return nil, err
	}
	was, err := os.ReadFile(allowed)
	if err != nil {
		return nil, err
	}
	list := strings.Fields(string(was))
	for _, cc := range ccs {
		if !slices.Contains(strings.Fields(string(avail)), cc) {
			return nil, fmt.Errorf("congestion control %s: the kernel has %s", cc, strings.TrimSpace(string(avail)))
		}
		if !slices.Contains(list, cc) {
			list = append(list, cc)
		}
	}
	if len(list) == len(strings.Fields(string(was))) {
		return func() {}, nil
	}
	if err := os.WriteFile(allowed, []byte(strings.Join(list, " ")), 0o644); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { os.WriteFile(allowed, was, 0o644) }) }, nil
}

// SetCongestionControl makes cc the namespace's default congestion control and checks it
// took.
func (node *Node) SetCongestionControl(cc string) error {
	if out, err := node.Command("sysctl", "-qw", "net.ipv4.tcp_congestion_control="+cc).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: congestion control %s: %v: %s", node.NS, cc, err, strings.TrimSpace(string(out)))
	}
	got, err := node.Command("sysctl", "-n", "net.ipv4.tcp_congestion_control").Output()
	if err != nil || strings.TrimSpace(string(got)) != cc {
		return fmt.Errorf("%s: congestion control is %q, want %s (%v)", node.NS, strings.TrimSpace(string(got)), cc, err)
	}
	return nil
}
