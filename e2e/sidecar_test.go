//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// sidecarManifests: an app whose own pods enter a chain (web -> seattle ->
// la, to a Service in the cluster), a Job doing the same, and a three-replica
// exit (backend) that hk reaches, each replica dialing its app over loopback.
const sidecarManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: web}
spec: {sidecar: {}}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: backend}
spec: {sidecar: {}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: from-web}
spec: {entry: web, exit: la, via: [seattle], route: [web, seattle, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: web-echo}
spec: {chain: from-web, listen: {port: 9000}, target: "echo.edge.svc.cluster.local:8080"}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: to-backend}
spec: {entry: hk, exit: backend, route: [hk, backend]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: be}
spec: {chain: to-backend, listen: {port: 8090}, target: "127.0.0.1:8080"}
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
apiVersion: apps/v1
kind: Deployment
metadata: {name: client}
spec:
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client, hoplink.dev/relaynode: web}}
    spec:
      containers: [{name: app, image: APP, args: [get, "http://localhost:9000/", --every, 2s]}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  backoffLimit: 0
  template:
    metadata: {labels: {hoplink.dev/relaynode: web}}
    spec:
      restartPolicy: Never
      containers: [{name: app, image: APP, args: [get, "http://127.0.0.1:9000/"]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: backend}
spec:
  replicas: 3
  selector: {matchLabels: {app: backend}}
  template:
    metadata: {labels: {app: backend, hoplink.dev/relaynode: backend}}
    spec:
      containers:
      - name: app
        image: APP
        args: [serve, ":8080"]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
`

func sidecars(t *testing.T, a *cluster) {
	start := time.Now()
	a.apply(t, "edge", strings.ReplaceAll(sidecarManifests, "APP", appImage))

	t.Run("the Job completes through its sidecar", func(t *testing.T) {
		eventually(t, 3*time.Minute, "Job once succeeded", func() error {
			out, err := a.try("-n", "edge", "get", "job", "once", "-o", "jsonpath={.status.succeeded}/{.status.failed}")
			if err != nil || out != "1/" {
				return fmt.Errorf("%v: succeeded/failed %q", err, out)
			}
			return nil
		})
		logs := a.kubectl(t, "-n", "edge", "logs", "job/once", "-c", "app")
		if !strings.Contains(logs, "answer: pod echo-") {
			t.Errorf("the Job's app got no answer from echo through web -> seattle -> la:\n%s", logs)
		}
		t.Logf("Job completed %s after the apply", time.Since(start).Round(time.Second))
	})

	t.Run("a Deployment's pods reach the target by localhost", func(t *testing.T) {
		init := a.kubectl(t, "-n", "edge", "get", "pods", "-l", "app=client", "-o", "jsonpath={.items[0].spec.initContainers[0].name} {.items[0].spec.initContainers[0].restartPolicy}")
		if init != "hoplink-relay Always" {
			t.Errorf("client pod's first init container: %q, want the native sidecar hoplink-relay", init)
		}
		// Its certificate is its own: the kubelet's key, signed by the operator.
		signer := a.kubectl(t, "-n", "edge", "get", "pods", "-l", "app=client", "-o", `jsonpath={.items[0].spec.volumes[?(@.name=="hoplink-relay-certs")].projected.sources[1].podCertificate.signerName}`)
		if signer != "hoplink.dev/relay" {
			t.Errorf("client pod's certificate volume asks signer %q, want hoplink.dev/relay", signer)
		}
		eventually(t, 2*time.Minute, "an answer in the client's log", func() error {
			out, err := a.try("-n", "edge", "logs", "deployment/client", "-c", "app", "--tail", "5")
			if !strings.Contains(out, "answer: pod echo-") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	})

	t.Run("a three-replica exit answers from several pods", func(t *testing.T) {
		eventually(t, 3*time.Minute, "RelayNode backend: 3 sidecars ready", func() error {
			out, err := a.try("-n", "edge", "get", "relaynode", "backend", "-o", "jsonpath={.status.injected}/{.status.ready}/{.status.desired}")
			if out != "3/3/3" {
				return fmt.Errorf("%v: injected/ready/desired %s", err, out)
			}
			return nil
		})
		// Its headless Service has a slice per family the cluster has,
		// each listing the three pods: hk dials each pod on either.
		want := map[string]string{ipv4: "IPv4", ipv6: "IPv6"}
		eventually(t, time.Minute, "backend's Service and EndpointSlices of every family", func() error {
			fams, err := a.try("-n", "edge", "get", "service", "hoplink-relay-backend", "-o", "jsonpath={.spec.ipFamilies[*]}")
			if err != nil {
				return fmt.Errorf("%v: %s", err, fams)
			}
			eps, err := a.try("-n", "edge", "get", "endpointslices", "-l", "kubernetes.io/service-name=hoplink-relay-backend",
				"-o", `jsonpath={range .items[*]}{.addressType}={range .endpoints[?(@.conditions.ready==true)]}{.targetRef.name},{end} {end}`)
			if err != nil {
				return fmt.Errorf("%v: %s", err, eps)
			}
			for _, f := range a.families() {
				if !strings.Contains(fams, want[f]) {
					return fmt.Errorf("Service families %q, want %s too", fams, want[f])
				}
				n := 0
				for _, s := range strings.Fields(eps) {
					if typ, pods, _ := strings.Cut(s, "="); typ == want[f] {
						n += strings.Count(pods, ",")
					}
				}
				if n != 3 {
					return fmt.Errorf("%d ready %s endpoints, want 3: %s", n, want[f], eps)
				}
			}
			return nil
		})
		hkNode, hkIP := a.nodeContainer(t, "hk"), a.nodeIP(t, "hk", ipv6)
		pods := map[string]bool{}
		eventually(t, 2*time.Minute, "answers from at least two backend pods through hk", func() error {
			out, err := onNode(hkNode, fmt.Sprintf(`for i in 1 2 3 4 5 6; do exec 3<>/dev/tcp/%s/8090 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3 | grep '^pod '; exec 3>&-; done`, hkIP))
			for _, l := range strings.Fields(out) {
				if strings.HasPrefix(l, "backend-") {
					pods[l] = true
				}
			}
			if len(pods) < 2 {
				return fmt.Errorf("answers from %v (%v)", pods, err)
			}
			return nil
		})
		t.Logf("answered by %d backend pods", len(pods))
	})
}
