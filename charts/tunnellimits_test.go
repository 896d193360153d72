package charts

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// TestTunnelLimitsPolicy installs the chart's ValidatingAdmissionPolicy in
// a real API server and creates Tunnels in namespaces with and without
// ceilings: a namespace's labels hold its Tunnels' spec.limits, on create
// and update; other namespaces and tun Tunnels are left alone; a label
// that is not a number is named as the thing to fix.
func TestTunnelLimitsPolicy(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run make test, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	out, err := run(t, helm(t), "template", "rel", chart, "--show-only", "templates/tunnellimits.yaml")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	cfg, c := apiServer(t, filepath.Join("..", "config", "crd", "bases"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, o := range decode(t, out) {
		if err := c.Patch(ctx, o, client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	for ns, labels := range map[string]map[string]string{
		"hl-held":  {"limits.hoplink.dev/max-rate-mbps": "50", "limits.hoplink.dev/max-flows": "100"},
		"hl-free":  nil,
		"hl-bad":   {"limits.hoplink.dev/max-rate-mbps": "fifty"},
		"hl-later": nil,
	} {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("v1")
		o.SetKind("Namespace")
		o.SetName(ns)
		o.SetLabels(labels)
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	tunnel := func(ns, name, spec string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("hoplink.dev/v1alpha1")
		o.SetKind("Tunnel")
		o.SetNamespace(ns)
		o.SetName(name)
		var m map[string]any
		if err := yaml.Unmarshal([]byte("{"+spec+"}"), &m); err != nil {
			t.Fatal(err)
		}
		o.Object["spec"] = m
		return o
	}
	const tcp = `chain: c, listen: {port: 8080}, target: "10.0.0.1:80"`
	// The API server takes a new policy in a moment: wait until it holds.
	deadline := time.Now().Add(30 * time.Second)
	for c.Create(ctx, tunnel("hl-held", "probe", tcp), client.DryRunAll) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the policy does not hold 30 s after it was created")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tc := range []struct {
		name, ns, spec string
		refused        []string // what the refusal names; none: taken
	}{
		{"no limits and no ceilings", "hl-free", tcp, nil},
		{"no limits under ceilings", "hl-held", tcp, []string{"spec.limits.rateMbps", "50 Mbit/s", "limits.hoplink.dev/max-rate-mbps"}},
		{"at the ceilings", "hl-held", tcp + ", limits: {rateMbps: 50, maxFlows: 100}", nil},
		{"rate over", "hl-held", tcp + ", limits: {rateMbps: 60, maxFlows: 100}", []string{"spec.limits.rateMbps", "50 Mbit/s"}},
		{"flows over", "hl-held", tcp + ", limits: {rateMbps: 10, maxFlows: 200}", []string{"spec.limits.maxFlows", "100 flows"}},
		{"rate without flows", "hl-held", tcp + ", limits: {rateMbps: 10}", []string{"spec.limits.maxFlows"}},
		{"tun", "hl-held", `chain: c, protocol: tun, tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}`, nil},
		{"a label not a number", "hl-bad", tcp + ", limits: {rateMbps: 10}", []string{"limits.hoplink.dev/max-rate-mbps=fifty", "fix the label"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			err := c.Create(ctx, tunnel(tc.ns, name, tc.spec))
			switch {
			case tc.refused == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != nil && err == nil:
				t.Fatal("taken")
			}
			for _, w := range tc.refused {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not name %q: %v", w, err)
				}
			}
		})
	}
	// tun Tunnels are not held, even by a label that is not a number.
	if err := c.Create(ctx, tunnel("hl-bad", "tun", `chain: c, protocol: tun, tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}`)); err != nil {
		t.Errorf("a tun Tunnel where a label is not a number: %v", err)
	}
	// The operator writes the clusterset's Tunnels: they are not held.
	user := regexp.MustCompile(`system:serviceaccount:[a-z0-9.-]+:[a-z0-9.-]+`).FindString(string(out))
	if user == "" {
		t.Fatal("the policy names no operator service account")
	}
	// RBAC is not what this test looks at: the account may write Tunnels.
	crb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "operator-in-test"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
		"subjects": []any{map[string]any{"kind": "User", "name": user}},
	}}
	if err := c.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	opCfg := rest.CopyConfig(cfg)
	opCfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	op, err := client.New(opCfg, client.Options{Scheme: scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Create(ctx, tunnel("hl-held", "by-the-operator", tcp)); err != nil {
		t.Errorf("the operator's Tunnel: %v", err)
	}
	// A Tunnel written before its namespace was labelled keeps taking
	// metadata; a change of its spec is held.
	if err := c.Create(ctx, tunnel("hl-later", "before", tcp)); err != nil {
		t.Fatal(err)
	}
	var ns unstructured.Unstructured
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	if err := c.Get(ctx, client.ObjectKey{Name: "hl-later"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.SetLabels(map[string]string{"limits.hoplink.dev/max-rate-mbps": "5"})
	if err := c.Update(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	var before unstructured.Unstructured
	before.SetAPIVersion("hoplink.dev/v1alpha1")
	before.SetKind("Tunnel")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "hl-later", Name: "before"}, &before); err != nil {
		t.Fatal(err)
	}
	before.SetAnnotations(map[string]string{"team": "net"})
	if err := c.Update(ctx, &before); err != nil {
		t.Errorf("an annotation on a Tunnel written before the label: %v", err)
	}
	unstructured.SetNestedField(before.Object, "10.0.0.2:80", "spec", "target")
	if err := c.Update(ctx, &before); err == nil || !strings.Contains(err.Error(), "spec.limits.rateMbps") {
		t.Errorf("a spec change of a Tunnel written before the label: %v", err)
	}

	// An update is held as a create is.
	var taken unstructured.Unstructured
	taken.SetAPIVersion("hoplink.dev/v1alpha1")
	taken.SetKind("Tunnel")
	if err := c.Get(ctx, client.ObjectKey{Namespace: "hl-held", Name: "at-the-ceilings"}, &taken); err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedField(taken.Object, int64(500), "spec", "limits", "rateMbps")
	if err := c.Update(ctx, &taken); err == nil || !strings.Contains(err.Error(), "spec.limits.rateMbps") {
		t.Errorf("an update past the ceiling: %v", err)
	}
}
