//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestIPv6Only runs the operator, two relays on one node, a Tunnel and a
// sidecar relay in a cluster of one node whose nodes, pods and Services
// have IPv6 addresses only (the kind network is dual-stack; the node's pod
// network hands out IPv6 alone).
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

	t.Run("a sidecar in a pod with IPv6 alone", func(t *testing.T) {
		start := time.Now()
		c.apply(t, "edge", strings.ReplaceAll(v6SidecarManifests, "APP", appImage))
		eventually(t, 3*time.Minute, "Job v6once succeeded", func() error {
			out, err := c.try("-n", "edge", "get", "job", "v6once", "-o", "jsonpath={.status.succeeded}/{.status.failed}")
			if err != nil || out != "1/" {
				return fmt.Errorf("%v: succeeded/failed %q", err, out)
			}
			return nil
		})
		for _, ctr := range []string{"ipv6", "ipv4"} {
			if logs := c.kubectl(t, "-n", "edge", "logs", "job/v6once", "-c", ctr); !strings.Contains(logs, "answer: pod echo-") {
				t.Errorf("the Job's %s container got no answer from echo through v6app -> v6b:\n%s", ctr, logs)
			}
		}
		if addr := c.kubectl(t, "-n", "edge", "get", "tunnel", "app", "-o", "jsonpath={.status.address}"); addr != "localhost:9000" {
			t.Errorf("Tunnel app's status.address %q, want localhost:9000 (both loopbacks)", addr)
		}
		t.Logf("Job completed %s after the apply", time.Since(start).Round(time.Second))
	})
}

// v6SidecarManifests: a Job whose pod enters a chain through its own
// sidecar relay (v6app -> v6b, to an echo Service), fetching through the
// Tunnel on each loopback: ::1, and 127.0.0.1, which a pod with IPv6
// alone still has.
const v6SidecarManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: v6app}
spec: {sidecar: {}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: from-app}
spec: {entry: v6app, exit: v6b, route: [v6app, v6b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: app}
spec: {chain: from-app, listen: {port: 9000}, target: "echo.edge.svc.cluster.local:8080"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers: [{name: app, image: APP, args: [serve, ":8080"]}]
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{port: 8080}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: v6once}
spec:
  backoffLimit: 0
  template:
    metadata: {labels: {hoplink.dev/relaynode: v6app}}
    spec:
      restartPolicy: Never
      containers:
      - {name: ipv6, image: APP, args: [get, "http://[::1]:9000/"]}
      - {name: ipv4, image: APP, args: [get, "http://127.0.0.1:9000/"]}
`
