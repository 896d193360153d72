package charts

import (
	"bytes"
	"context"
	"fmt"
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
	createNamespaces(ctx, t, c, map[string]map[string]string{
		"hl-held":  {"limits.hoplink.dev/max-rate-mbps": "50", "limits.hoplink.dev/max-flows": "100"},
		"hl-free":  nil,
		"hl-bad":   {"limits.hoplink.dev/max-rate-mbps": "fifty"},
		"hl-later": nil,
		"hl-light": {"limits.hoplink.dev/max-weight": "4"},
		"hl-heavy": {"limits.hoplink.dev/max-weight": "400"},
	})
	tunnel := func(ns, name, spec string) *unstructured.Unstructured { return newTunnel(t, ns, name, spec) }
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
		{"no weight under a weight ceiling", "hl-light", tcp, nil},
		{"at the weight ceiling", "hl-light", tcp + ", limits: {weight: 4}", nil},
		{"weight over", "hl-light", tcp + ", limits: {weight: 5}", []string{"spec.limits.weight", "weight of 4", "limits.hoplink.dev/max-weight"}},
		{"a weight label out of range", "hl-heavy", tcp, []string{"limits.hoplink.dev/max-weight=400", "fix the label"}},
		{"a weight where no label allows one", "hl-free", tcp + ", limits: {weight: 2}", []string{"spec.limits.weight", "weight of 1", "tunnelLimits.maxWeight"}},
		{"weight 1 where no label allows more", "hl-free", tcp + ", limits: {weight: 1}", nil},
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
	op := operatorClient(ctx, t, cfg, c, out)
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

func newTunnel(t *testing.T, ns, name, spec string) *unstructured.Unstructured {
	t.Helper()
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

func createNamespaces(ctx context.Context, t *testing.T, c client.Client, labels map[string]map[string]string) {
	t.Helper()
	for ns, l := range labels {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("v1")
		o.SetKind("Namespace")
		o.SetName(ns)
		o.SetLabels(l)
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTunnelDefaultsPolicy installs the chart's MutatingAdmissionPolicy and
// ValidatingAdmissionPolicy in a real API server: a namespace's default
// labels fill the spec.limits a Tunnel leaves out, before its ceilings are
// checked; a value the Tunnel sets is kept; a default above the ceiling, or
// a default label that is not a value the field takes, is refused and
// named; tun Tunnels and the operator's are left alone; and where nothing
// fills the defaults (a cluster before 1.36) the Tunnel is refused rather
// than left without the limit.
func TestTunnelDefaultsPolicy(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run make test, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	h := helm(t)
	// MutatingAdmissionPolicy is v1 from 1.36: older clusters get none.
	for kube, want := range map[string]bool{"1.35.0": false, "1.36.0": true} {
		out, err := run(t, h, "template", "rel", chart, "--kube-version", kube, "--show-only", "templates/tunnellimits.yaml")
		if err != nil {
			t.Fatalf("helm template: %v", err)
		}
		if got := bytes.Contains(out, []byte("kind: MutatingAdmissionPolicy\n")); got != want {
			t.Errorf("Kubernetes %s: a MutatingAdmissionPolicy rendered: %v, want %v", kube, got, want)
		}
	}
	out, err := run(t, h, "template", "rel", chart, "--show-only", "templates/tunnellimits.yaml")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	cfg, c := apiServer(t, filepath.Join("..", "config", "crd", "bases"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	objs := decode(t, out)
	for _, o := range objs {
		if err := c.Patch(ctx, o, client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	createNamespaces(ctx, t, c, map[string]map[string]string{
		"hl-defaults":    {"limits.hoplink.dev/default-rate-mbps": "20", "limits.hoplink.dev/default-max-flows": "30"},
		"hl-both":        {"limits.hoplink.dev/default-rate-mbps": "20", "limits.hoplink.dev/default-max-flows": "30", "limits.hoplink.dev/max-rate-mbps": "50", "limits.hoplink.dev/max-flows": "100"},
		"hl-over":        {"limits.hoplink.dev/default-rate-mbps": "80", "limits.hoplink.dev/max-rate-mbps": "50"},
		"hl-bad-default": {"limits.hoplink.dev/default-max-flows": "lots"},
		"hl-big-default": {"limits.hoplink.dev/default-rate-mbps": "200000"},
		"hl-free":        nil,
		"hl-later":       nil,
	})
	const tcp = `chain: c, listen: {port: 8080}, target: "10.0.0.1:80"`
	const tun = `chain: c, protocol: tun, tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}`
	limits := func(o *unstructured.Unstructured) (rate, flows int64) {
		rate, _, _ = unstructured.NestedInt64(o.Object, "spec", "limits", "rateMbps")
		flows, _, _ = unstructured.NestedInt64(o.Object, "spec", "limits", "maxFlows")
		return rate, flows
	}
	// The API server mutates a Tunnel once it has the CRD's schema, some
	// seconds after both are created: wait until the default is filled.
	deadline := time.Now().Add(90 * time.Second)
	for {
		probe := newTunnel(t, "hl-defaults", "probe", tcp)
		err := c.Create(ctx, probe, client.DryRunAll)
		if rate, _ := limits(probe); err == nil && rate == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no default filled 90 s after the policy was created (last: %v)", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, tc := range []struct {
		name, ns, spec string
		rate, flows    int64    // the limits the Tunnel is taken with
		refused        []string // what the refusal names; none: taken
	}{
		{"defaults fill", "hl-defaults", tcp, 20, 30, nil},
		{"a set rate is kept", "hl-defaults", tcp + ", limits: {rateMbps: 5}", 5, 30, nil},
		{"set limits are kept", "hl-defaults", tcp + ", limits: {rateMbps: 500, maxFlows: 7}", 500, 7, nil},
		{"defaults under ceilings", "hl-both", tcp, 20, 30, nil},
		{"a default over the ceiling", "hl-over", tcp, 0, 0, []string{"spec.limits.rateMbps", "80 Mbit/s", "limits.hoplink.dev/default-rate-mbps", "limits.hoplink.dev/max-rate-mbps", "lower the default label to 50"}},
		{"a set rate under the ceiling beside a default over it", "hl-over", tcp + ", limits: {rateMbps: 40}", 40, 0, nil},
		{"a default label not a number", "hl-bad-default", tcp, 0, 0, []string{"limits.hoplink.dev/default-max-flows=lots", "fix the label"}},
		{"a default label out of range", "hl-big-default", tcp, 0, 0, []string{"limits.hoplink.dev/default-rate-mbps=200000", "from 1 to 100000", "fix the label"}},
		{"tun", "hl-defaults", tun, 0, 0, nil},
		{"tun beside a bad default", "hl-bad-default", tun, 0, 0, nil},
		{"no labels", "hl-free", tcp, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newTunnel(t, tc.ns, strings.ReplaceAll(tc.name, " ", "-"), tc.spec)
			err := c.Create(ctx, o)
			switch {
			case tc.refused == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != nil && err == nil:
				t.Fatalf("taken with %v", o.Object["spec"])
			}
			for _, w := range tc.refused {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not name %q: %v", w, err)
				}
			}
			if err != nil {
				return
			}
			if rate, flows := limits(o); rate != tc.rate || flows != tc.flows {
				t.Errorf("taken with rateMbps %d, maxFlows %d; want %d, %d", rate, flows, tc.rate, tc.flows)
			}
			if _, found, _ := unstructured.NestedMap(o.Object, "spec", "limits"); found && tc.rate == 0 && tc.flows == 0 {
				t.Errorf("spec.limits written where no default applies: %v", o.Object["spec"])
			}
		})
	}

	// The operator's Tunnels (the clusterset's) take no defaults.
	op := operatorClient(ctx, t, cfg, c, out)
	byOp := newTunnel(t, "hl-defaults", "by-the-operator", tcp)
	if err := op.Create(ctx, byOp); err != nil {
		t.Errorf("the operator's Tunnel: %v", err)
	} else if _, found, _ := unstructured.NestedMap(byOp.Object, "spec", "limits"); found {
		t.Errorf("the operator's Tunnel took defaults: %v", byOp.Object["spec"])
	}

	// A Tunnel written before its namespace had defaults keeps its spec
	// through a metadata change, and takes them when its spec changes.
	if err := c.Create(ctx, newTunnel(t, "hl-later", "before", tcp)); err != nil {
		t.Fatal(err)
	}
	var ns unstructured.Unstructured
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	if err := c.Get(ctx, client.ObjectKey{Name: "hl-later"}, &ns); err != nil {
		t.Fatal(err)
	}
	ns.SetLabels(map[string]string{"limits.hoplink.dev/default-rate-mbps": "9"})
	if err := c.Update(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	get := func() *unstructured.Unstructured {
		o := newTunnel(t, "hl-later", "before", "")
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	before := get()
	before.SetAnnotations(map[string]string{"team": "net"})
	if err := c.Update(ctx, before); err != nil {
		t.Fatalf("an annotation: %v", err)
	}
	if rate, _ := limits(before); rate != 0 {
		t.Errorf("an annotation filled spec.limits.rateMbps with %d", rate)
	}
	// The API server sees the label through its informer: allow it a moment.
	deadline = time.Now().Add(10 * time.Second)
	for i := 2; ; i++ {
		before = get()
		unstructured.SetNestedField(before.Object, fmt.Sprintf("10.0.0.%d:80", i), "spec", "target")
		if err := c.Update(ctx, before); err != nil {
			t.Fatalf("a spec change: %v", err)
		}
		if rate, _ := limits(before); rate == 9 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a spec change took no default: %v", before.Object["spec"])
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Without the mutating policy (as before 1.36) a Tunnel that would take
	// a default is refused, not left without the limit.
	for _, o := range objs {
		if o.GetKind() == "MutatingAdmissionPolicyBinding" {
			if err := c.Delete(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		err := c.Create(ctx, newTunnel(t, "hl-defaults", "unfilled", tcp), client.DryRunAll)
		if err != nil {
			for _, w := range []string{"spec.limits.rateMbps", "limits.hoplink.dev/default-rate-mbps", "nothing filled it in"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not name %q: %v", w, err)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a Tunnel without the default is taken 30 s after the mutating policy's binding was deleted")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// operatorClient is a client acting as the operator's service account,
// which the rendered policies out name and leave alone; RBAC is not what
// these tests look at, so the account may write Tunnels.
func operatorClient(ctx context.Context, t *testing.T, cfg *rest.Config, c client.Client, out []byte) client.Client {
	t.Helper()
	user := regexp.MustCompile(`system:serviceaccount:[a-z0-9.-]+:[a-z0-9.-]+`).FindString(string(out))
	if user == "" {
		t.Fatal("the policy names no operator service account")
	}
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
	return op
}
