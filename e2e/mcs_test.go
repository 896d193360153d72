//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// servicesAcrossClusters runs the Multi-Cluster Services part of
// docs/multi-cluster.md on the two clusters (installed in multicluster mode,
// trusting each other's CA, each knowing the other's relays): CoreDNS as
// the page configures it, a Service exported in A and called by name from
// B, then the MCS API's own conformance suite.
func servicesAcrossClusters(t *testing.T, a, b *cluster, blocks map[string]string) {
	kubeconfig := mergedKubeconfig(t, a, b)
	env := append(os.Environ(), "KUBECONFIG="+kubeconfig, "A=kind-"+a.name, "B=kind-"+b.name,
		"PATH="+filepath.Dir(kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	// CoreDNS: A's by the page's commands, B's by its operator (the chart's
	// multicluster.coreDNS.configure).
	dns := exec.Command("bash", "-euo", "pipefail", "-c", blocks["coredns"])
	dns.Dir, dns.Env = work, append(env, "CTX=kind-"+a.name)
	if out, err := dns.CombinedOutput(); err != nil {
		t.Fatalf("the CoreDNS commands of %s: %v\n%s", multiClusterDoc, err, out)
	}
	eventually(t, 2*time.Minute, "B's operator adding the clusterset zone to CoreDNS", func() error {
		out, err := b.try("-n", "kube-system", "get", "configmap", "coredns", "-o", "jsonpath={.data.Corefile}")
		if err != nil || !strings.Contains(out, "multicluster clusterset.local") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	b.kubectl(t, "-n", "kube-system", "rollout", "status", "deployment", "coredns", "--timeout", "3m")
	// The suite's images (nothing can be pulled here), in both clusters.
	out, err := command(root, "hack/kind/mcs-images.sh")
	if err != nil {
		t.Fatalf("hack/kind/mcs-images.sh: %v\n%s", err, out)
	}
	images := strings.Fields(lastLines(out, 2))
	for _, c := range []*cluster{a, b} {
		sh(t, append([]string{kindBin, "load", "docker-image", "--name", c.name}, images...)...)
	}

	t.Run("a Service exported in A answers by name in B", func(t *testing.T) {
		for _, c := range []*cluster{a, b} {
			c.namespace(t, "demo")
		}
		a.apply(t, "demo", `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: app, image: `+appImage+`, imagePullPolicy: Never, args: [serve, ":8080"]}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{name: http, port: 8080}]}
`)
		a.kubectl(t, "-n", "demo", "rollout", "status", "deployment", "web", "--timeout", "2m")
		// A client in B that asks by name every second, and says when.
		b.apply(t, "demo", `apiVersion: v1
kind: Pod
metadata: {name: caller}
spec:
  containers: [{name: app, image: `+appImage+`, imagePullPolicy: Never,
    args: [get, "http://web.demo.svc.clusterset.local:8080/", --every, 1s]}]
`)
		b.kubectl(t, "-n", "demo", "wait", "pod/caller", "--for=condition=Ready", "--timeout", "2m")

		exported := time.Now()
		a.apply(t, "demo", blocks["export"])
		var answered time.Time
		eventually(t, 2*time.Minute, "web.demo.svc.clusterset.local answering in B", func() error {
			at, line := firstLog(t, b, "demo", "caller", exported, "answer: pod web-")
			if at.IsZero() {
				return fmt.Errorf("no answer yet: %s", line)
			}
			answered = at
			return nil
		})
		t.Logf("the name answered in B %.1f s after the ServiceExport was applied in A", answered.Sub(exported).Seconds())
		for _, c := range []*cluster{a, b} {
			t.Logf("cluster %s:\n%s", c.name, c.kubectl(t, "-n", "demo", "get", "serviceimports"))
		}
		cond := a.kubectl(t, "-n", "demo", "get", "serviceexport", "web", "-o", `jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}`)
		t.Logf("ServiceExport web in A:\n%s", cond)
		for _, want := range []string{"Valid=True", "Ready=True", "Conflict=False"} {
			if !strings.Contains(cond, want) {
				t.Errorf("ServiceExport web: no %s in\n%s", want, cond)
			}
		}

		unexported := time.Now()
		a.kubectl(t, "-n", "demo", "delete", "serviceexport", "web")
		eventually(t, time.Minute, "the ServiceImport gone from B", func() error {
			if out, err := b.try("-n", "demo", "get", "serviceimport", "web"); err == nil {
				return fmt.Errorf("still there: %s", out)
			}
			return nil
		})
		var failed time.Time
		eventually(t, time.Minute, "web.demo.svc.clusterset.local gone in B", func() error {
			at, line := firstLog(t, b, "demo", "caller", unexported, "error: ")
			if at.IsZero() {
				return fmt.Errorf("still answering: %s", line)
			}
			failed = at
			return nil
		})
		t.Logf("the name stopped answering in B %.1f s after the ServiceExport was deleted in A", failed.Sub(unexported).Seconds())
		b.kubectl(t, "-n", "demo", "delete", "pod", "caller", "--wait=false")
	})

	t.Run("MCS conformance", func(t *testing.T) {
		cmd := exec.Command("hack/mcs/suite.sh", "run", kubeconfig, "kind-"+a.name+",kind-"+b.name)
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		t.Logf("conformance suite:\n%s", lastLines(string(out), 60))
		if err != nil {
			t.Errorf("the MCS conformance suite failed: %v (report: bin/mcs/report.yaml)", err)
		}
	})
}

// mergedKubeconfig writes one kubeconfig with both clusters' contexts.
func mergedKubeconfig(t *testing.T, cs ...*cluster) string {
	t.Helper()
	var paths []string
	for _, c := range cs {
		paths = append(paths, c.kubeconfig)
	}
	cmd := exec.Command(kubectl, "config", "view", "--flatten")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+strings.Join(paths, string(os.PathListSeparator)))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl config view --flatten: %v", err)
	}
	return writeWork(t, "clusterset.kubeconfig", string(out))
}

// firstLog is the time of the first line of a pod's log after since that
// contains substr, or zero, with the last line for a message.
func firstLog(t *testing.T, c *cluster, ns, pod string, since time.Time, substr string) (time.Time, string) {
	t.Helper()
	out, err := c.try("-n", ns, "logs", pod, "--timestamps", "--since-time", since.UTC().Format(time.RFC3339))
	if err != nil {
		return time.Time{}, out
	}
	var last string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		ts, line, _ := strings.Cut(sc.Text(), " ")
		last = line
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(since) || !strings.Contains(line, substr) {
			continue
		}
		return at, line
	}
	return time.Time{}, last
}
