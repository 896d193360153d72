//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestIPv6Only runs the operator, two relays on one node and a Tunnel in a
// cluster of one node whose nodes, pods and Services have IPv6 addresses
// only (the kind network is dual-stack; the node's pod network hands out
// IPv6 alone).
func TestIPv6Only(t *testing.T) {
	c := newCluster(t, "hoplink-v6", ipv6, "v6")
	node := c.nodeContainer(t, "v6")
	nodeIP := c.nodeIP(t, "v6", ipv6)
	c.helmInstall(t)

	t.Run("the operator runs on IPv6 alone", func(t *testing.T) {
		out := c.kubectl(t, "-n", "hoplink-system", "get", "pods", "-l", "app.kubernetes.io/component=operator",
			"-o", `jsonpath={range .items[*]}{range .status.podIPs[*]}{.ip} {end}{end}`)
		if err := hasFamilies(strings.Fields(out), c.families()); err != nil {
			t.Errorf("operator pods' podIPs %q: %v", out, err)
		}
	})

	c.namespace(t, "edge", "hoplink.dev/privileged-relays=true")
	// Two relays on the one node (two ports), a static chain between them
	// and a Tunnel whose target is the API server.
	c.apply(t, "edge", `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: v6a}
spec: {listen: {port: 7401}, nodeSelector: {hoplink.dev/site: v6}}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: v6b}
spec: {listen: {port: 7403}, nodeSelector: {hoplink.dev/site: v6}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: v6}
spec: {entry: v6a, exit: v6b, mode: static, route: [v6a, v6b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: web}
spec: {chain: v6, protocol: tcp, listen: {port: 8080}, target: "kubernetes.default.svc.cluster.local:443"}
`)

	t.Run("relays ready with IPv6 endpoints", func(t *testing.T) {
		for _, rn := range []string{"v6a", "v6b"} {
			eventually(t, 3*time.Minute, "RelayNode "+rn+" ready", func() error {
				out, err := c.try("-n", "edge", "get", "relaynode", rn, "-o", `jsonpath={.status.ready}/{.status.desired} {.status.endpoints[*]}`)
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				ready, eps, _ := strings.Cut(out, " ")
				if ready != "1/1" {
					return fmt.Errorf("ready/desired %s", out)
				}
				return hasFamilies(strings.Fields(eps), c.families())
			})
		}
	})

	t.Run("TCP through the Tunnel's Service", func(t *testing.T) {
		eventually(t, time.Minute, "the Service web", func() error {
			_, err := c.try("-n", "edge", "get", "service", "web")
			return err
		})
		for _, ip := range clusterIPs(t, c, "edge", "web") {
			eventually(t, 2*time.Minute, "an answer from the API server through v6a -> v6b at "+ip, func() error {
				out, err := httpToTLS(node, ip, 8080)
				if !strings.Contains(out, httpsAnswer) {
					return fmt.Errorf("%v: %q", err, out)
				}
				return nil
			})
		}
		eventually(t, time.Minute, "v6a's link to v6b on IPv6", func() error {
			m, err := onNode(node, fmt.Sprintf(`exec 3<>/dev/tcp/%s/7402 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3`, nodeIP))
			if f := peerFamily(m, "v6a", "v6b"); f != ipv6 {
				return fmt.Errorf("family %q (%v):\n%s", f, err, grep(m, "hoplink_peer_family_info"))
			}
			return nil
		})
	})
}
