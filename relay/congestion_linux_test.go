package relay

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// The send buffer a relay reports is its network namespace's most, as the
// kernel's autotuning has it (net.ipv4.tcp_wmem's third figure).
func TestSendBufferMaxIsTheNamespaces(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if got := sendBufferMax(); got <= 0 || strconv.FormatInt(got, 10) != f[2] {
		t.Fatalf("sendBufferMax() = %d, want tcp_wmem's third figure %s", got, f[2])
	}
}
