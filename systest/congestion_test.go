package systest

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestLinksRunBBROnACubicHost: relays on a host whose default congestion
// control is cubic (as most are) run bbr on their TLS links, dialed and
// accepted, and say so in their metrics; the sockets toward clients and
// targets keep the host's default; spec.links.congestionControl pins
// another algorithm.
func TestLinksRunBBROnACubicHost(t *testing.T) {
	requireNetns(t)
	bin := procs.Hoplink(t)
	for _, tc := range []struct{ links, want, reason string }{
		{"", "bbr", "auto"},
		{"links: {congestionControl: reno}, ", "reno", "pinned"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			testutil.AllowCongestion(t, "cubic")
			ns := newNetns(t, "hlcc")
			procs.Run(t, "ip", "netns", "exec", ns.name, "sysctl", "-qw", "net.ipv4.tcp_congestion_control=cubic")
			dir := t.TempDir()
			const size = 8 << 20
			ns.serve("127.0.0.1:7600", func(c *net.TCPConn) {
				io.Copy(c, testutil.RandReader(1, size))
				c.Close()
			})
			manifest := fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {%slisten: {address: 127.0.0.1, port: 7401}, endpoints: ["127.0.0.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {%slisten: {address: 127.0.0.1, port: 7402}, endpoints: ["127.0.0.1:7402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: t}
spec: {chain: c, listen: {address: 127.0.0.1, port: 7500}, target: "127.0.0.1:7600"}
`, tc.links, tc.links)
			certs := procs.RelayFiles(t, bin, dir, "m.yaml", manifest, "hk", "la")
			for i, r := range []string{"hk", "la"} {
				ns.start(filepath.Join(dir, r+".log"), bin, "relay", "-f", filepath.Join(dir, "m.yaml"), "--name", r, "--certs", certs,
					"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", 9460+i))
			}
			t.Cleanup(func() {
				if t.Failed() {
					for _, r := range []string{"hk", "la"} {
						t.Logf("%s log:\n%s", r, lastLines(filepath.Join(dir, r+".log"), 20))
					}
				}
			})
			// A slow download keeps the flow's sockets open while ss looks.
			var sockets string
			testutil.WaitFor(t, "a flow through the chain", func() error {
				var err error
				ns.do(func() {
					var c net.Conn
					if c, err = net.DialTimeout("tcp", "127.0.0.1:7500", 2*time.Second); err != nil {
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err = io.ReadFull(c, make([]byte, 1<<20)); err != nil {
						return
					}
					out, _ := exec.Command("ip", "netns", "exec", ns.name, "ss", "-Htin", "state", "established").CombinedOutput()
					sockets = string(out)
				})
				return err
			})
			links, ends := ccOf(sockets, ":7401", ":7402"), ccOf(sockets, ":7500", ":7600")
			if len(links) == 0 || len(ends) == 0 {
				t.Fatalf("no link or end sockets in ss's output:\n%s", sockets)
			}
			for _, cc := range links {
				if cc != tc.want {
					t.Errorf("a TLS link socket runs %s, want %s:\n%s", cc, tc.want, sockets)
				}
			}
			for _, cc := range ends {
				if cc != "cubic" {
					t.Errorf("a client or target socket runs %s, want the host's cubic:\n%s", cc, sockets)
				}
			}
			// The metrics, asked from inside the namespace (an HTTP client
			// would dial from another thread, outside it).
			var body string
			ns.do(func() {
				c, err := net.DialTimeout("tcp", "127.0.0.1:9460", 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprint(c, "GET /metrics HTTP/1.0\r\n\r\n")
				b, _ := io.ReadAll(c)
				body = string(b)
			})
			want := fmt.Sprintf(`hoplink_link_congestion_control_info{algorithm=%q,from="hk",reason=%q} 1`, tc.want, tc.reason)
			if !strings.Contains(body, want) {
				t.Errorf("hk's metrics lack %s", want)
			}
		})
	}
}

// ccOf returns the congestion control of each socket in ss -tin's output
// whose line names one of the ports.
func ccOf(ss string, ports ...string) []string {
	lines := strings.Split(ss, "\n")
	var out []string
	for i := 0; i+1 < len(lines); i++ {
		for _, p := range ports {
			if strings.Contains(lines[i], p+" ") {
				if f := strings.Fields(lines[i+1]); len(f) > 0 {
					out = append(out, f[0])
				}
				break
			}
		}
	}
	return out
}
