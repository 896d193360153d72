package systest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
)

// snatManifests: web runs in a pod network behind its node's SNAT (a
// sidecar); useast runs on that node's own network (a host-network relay,
// same port). web's chain goes to sea; sea's chain goes to useast.
const snatManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: web}
spec: {listen: {port: 7401}, endpoints: ["10.231.52.2:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: sea}
spec: {listen: {port: 7401}, endpoints: ["10.231.51.1:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: useast}
spec: {listen: {port: 7401}, endpoints: ["10.231.51.2:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: out}
spec: {entry: web, exit: sea, route: [web, sea]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: east}
spec: {entry: sea, exit: useast, route: [sea, useast]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: to-east}
spec: {chain: east, listen: {address: 127.0.0.1, port: 15500}, target: "127.0.0.1:5300"}
`

// TestDialingBehindSNAT: a relay behind SNAT (a sidecar in a pod network)
// must not take over the address of a relay on its node's network. Had web
// dialed sea from its relay port, the node's SNAT would have kept that port,
// and sea's own connection to useast (the node's address, the same port)
// would have matched web's NAT entry and reached web instead: "certificate
// is valid for web, not useast", as the kind e2e once showed.
func TestDialingBehindSNAT(t *testing.T) {
	requireNetns(t)
	behindSNAT(t, "--separate-dial-port")
}

// behindSNAT runs the setup; separate are web's extra flags.
func behindSNAT(t *testing.T, separate ...string) {
	bin := procs.Hoplink(t)
	dir := t.TempDir()
	certs := procs.RelayFiles(t, bin, dir, "hoplink.yaml", snatManifests, "web", "sea", "useast")

	sea := newNetns(t, "hlsnat-sea")
	node := newNetns(t, "hlsnat-node")
	pod := newNetns(t, "hlsnat-pod")
	link(t, sea, node, 51, "to-node", "to-sea")
	link(t, node, pod, 52, "to-pod", "eth0")
	procs.Run(t, "ip", "-n", pod.name, "route", "add", "default", "via", "10.231.52.1")
	procs.Run(t, "ip", "netns", "exec", node.name, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	procs.Run(t, "ip", "netns", "exec", node.name, "nft", "add table ip hlnat")
	procs.Run(t, "ip", "netns", "exec", node.name, "nft", "add chain ip hlnat post { type nat hook postrouting priority 100 ; }")
	procs.Run(t, "ip", "netns", "exec", node.name, "nft", `add rule ip hlnat post ip saddr 10.231.52.0/30 oifname "to-sea" masquerade`)

	node.serve("127.0.0.1:5300", func(c *net.TCPConn) {
		fmt.Fprintln(c, "useast")
		io.Copy(io.Discard, c)
	})
	// web first: its link to sea puts its NAT entry in place before sea
	// dials useast (sea is not up yet; web keeps trying).
	node.start(filepath.Join(dir, "useast.log"), bin, "relay", "-f", dir, "--name", "useast", "--certs", certs)
	pod.start(filepath.Join(dir, "web.log"), append([]string{bin, "relay", "-f", dir, "--name", "web", "--certs", certs}, separate...)...)
	time.Sleep(time.Second)
	sea.start(filepath.Join(dir, "sea.log"), bin, "relay", "-f", dir, "--name", "sea", "--certs", certs)

	deadline := time.Now().Add(20 * time.Second)
	for {
		var got string
		var err error
		sea.do(func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", "127.0.0.1:15500", 2*time.Second); err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			got, err = bufio.NewReader(c).ReadString('\n')
		})
		if strings.TrimSpace(got) == "useast" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from useast through sea (%v): sea's link to useast reached someone else; sea's log: %s", err, lastLines(filepath.Join(dir, "sea.log"), 5))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// lastLines is the end of a log file, for a failure message.
func lastLines(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
