package kube

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// A relay's View holds the objects that carry its member label and nothing
// else of its namespace: here relay a, in Chain ab with sidecar relay b,
// and not x, which b shares Chain bx with. An edit that adds x to ab is
// taken once the labels follow, not before. The labels are written as the
// operator would (no operator runs here).
func TestViewHoldsItsChainsOnly(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{"../../config/crd/bases"}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	scheme := runtime.NewScheme()
	clientgoscheme.AddToScheme(scheme)
	v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ns = "v"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	members := func(names ...string) map[string]string {
		l := map[string]string{}
		for _, n := range names {
			l[v1alpha1.MemberLabel(n)] = ""
		}
		return l
	}
	om := func(name string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}
	}
	relay := func(name string, sidecar bool, labels map[string]string) {
		rn := &v1alpha1.RelayNode{ObjectMeta: om(name, labels)}
		if sidecar {
			rn.Spec.Sidecar = &v1alpha1.RelaySidecar{}
		} else {
			rn.Spec.Endpoints = []string{"192.0.2.1:7401"}
		}
		mustCreate(t, c, rn)
		// Its name confirmed, as the operator says once it issued the certificate.
		rn.Status.CertificateNotAfter = &metav1.Time{Time: time.Now().Add(time.Hour)}
		if err := c.Status().Update(ctx, rn); err != nil {
			t.Fatal(err)
		}
	}
	relay("a", false, members("a", "b"))
	relay("b", true, members("a", "b", "x"))
	relay("x", false, members("b", "x"))
	ab := &v1alpha1.Chain{ObjectMeta: om("ab", members("a", "b")), Spec: v1alpha1.ChainSpec{Entry: "a", Exit: "b", Route: []string{"a", "b"}}}
	mustCreate(t, c, ab)
	mustCreate(t, c, &v1alpha1.Chain{ObjectMeta: om("bx", members("b", "x")), Spec: v1alpha1.ChainSpec{Entry: "b", Exit: "x", Route: []string{"b", "x"}}})
	for name, chain := range map[string]string{"t-ab": "ab", "t-bx": "bx"} {
		labels := members("a", "b")
		if chain == "bx" {
			labels = members("b", "x")
		}
		mustCreate(t, c, &v1alpha1.Tunnel{ObjectMeta: om(name, labels),
			Spec: v1alpha1.TunnelSpec{Chain: chain, Listen: &v1alpha1.TunnelListen{Port: 9000}, Target: "backend:80"}})
	}
	// b's replicas, on slices that copy its Service's labels: a slice per
	// family (its Service is PreferDualStack), pod b-0 on both, b-1 on
	// IPv4 alone.
	ready := discoveryv1.EndpointConditions{Ready: ptr.To(true)}
	pod := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name}
	}
	for name, s := range map[string]struct {
		family discoveryv1.AddressType
		eps    []discoveryv1.Endpoint
	}{
		"hoplink-relay-b-1": {discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, Conditions: ready, TargetRef: pod("b-0")},
			{Addresses: []string{"10.244.0.6"}, Conditions: ready, TargetRef: pod("b-1")}}},
		"hoplink-relay-b-2": {discoveryv1.AddressTypeIPv6, []discoveryv1.Endpoint{
			{Addresses: []string{"fd00:10:244::5"}, Conditions: ready, TargetRef: pod("b-0")}}},
	} {
		slice := &discoveryv1.EndpointSlice{ObjectMeta: om(name, members("a", "b", "x")), AddressType: s.family, Endpoints: s.eps}
		slice.Labels[discoveryv1.LabelServiceName] = "hoplink-relay-b"
		mustCreate(t, c, slice)
	}
	other := &discoveryv1.EndpointSlice{ObjectMeta: om("hoplink-relay-z-1", members("x", "z")), AddressType: discoveryv1.AddressTypeIPv4}
	other.Labels[discoveryv1.LabelServiceName] = "hoplink-relay-z"
	mustCreate(t, c, other)

	v, err := NewView(Options{Config: cfg, Namespace: ns, Name: "a", CertsDir: "unused"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cached, err := v.Cached(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"RelayNode": 2, "Chain": 1, "Tunnel": 1, "EndpointSlice": 2}; fmt.Sprint(cached) != fmt.Sprint(want) {
		t.Errorf("relay a caches %v, want %v: its own chain's objects alone", cached, want)
	}
	route := func(peers ...string) ([]string, error) {
		set, err := v.Manifests(ctx)
		if err != nil {
			return nil, err
		}
		if p := v.Problems(); len(p) > 0 {
			return nil, fmt.Errorf("problems: %v", p)
		}
		if got := slices.Sorted(slices.Values(set.RelayNames())); !slices.Equal(got, peers) {
			return nil, fmt.Errorf("relay a's manifests hold RelayNodes %v, want %v", got, peers)
		}
		if len(set.Chains) != 1 || len(set.Tunnels) != 1 || set.Tunnel(ns+"/t-ab") == nil {
			return nil, fmt.Errorf("relay a's manifests hold %d Chains and %d Tunnels, want ab and t-ab alone", len(set.Chains), len(set.Tunnels))
		}
		if got, want := set.Relay("b").Spec.Endpoints, []string{"10.244.0.5:7401", "10.244.0.6:7401", "[fd00:10:244::5]:7401"}; !slices.Equal(got, want) {
			return nil, fmt.Errorf("b dialed at %v, want its ready replicas' %v", got, want)
		}
		want := []manifest.Replica{{Name: "b-0", Endpoints: []string{"10.244.0.5:7401", "[fd00:10:244::5]:7401"}},
			{Name: "b-1", Endpoints: []string{"10.244.0.6:7401"}}}
		if got := set.ReplicasOf("b"); fmt.Sprint(got) != fmt.Sprint(want) {
			return nil, fmt.Errorf("b's replicas %v, want %v: a pod's families as one", got, want)
		}
		return manifest.Route(set.Chain(ns + "/ab")), nil
	}
	if r, err := route("a", "b"); err != nil || !slices.Equal(r, []string{"a", "b"}) {
		t.Fatalf("route %v, %v", r, err)
	}

	// x joins ab; until the labels follow, a runs ab as it was.
	ab.Spec.Via, ab.Spec.Route = []string{"x"}, []string{"a", "x", "b"}
	if err := c.Update(ctx, ab); err != nil {
		t.Fatal(err)
	}
	waitView(t, v, func() error {
		var got v1alpha1.ChainList
		if err := v.cache.List(ctx, &got); err != nil || len(got.Items) != 1 || len(got.Items[0].Spec.Via) != 1 {
			return fmt.Errorf("the edit has not reached the cache: %v", err)
		}
		return nil
	})
	if r, err := route("a", "b"); err != nil || !slices.Equal(r, []string{"a", "b"}) {
		t.Fatalf("before the labels: route %v, %v; want the Chain as it was", r, err)
	}
	var x v1alpha1.RelayNode
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "x"}, &x); err != nil {
		t.Fatal(err)
	}
	x.Labels[v1alpha1.MemberLabel("a")] = ""
	if err := c.Update(ctx, &x); err != nil {
		t.Fatal(err)
	}
	ab.Labels[v1alpha1.MemberLabel("x")] = ""
	if err := c.Update(ctx, ab); err != nil {
		t.Fatal(err)
	}
	waitView(t, v, func() error {
		r, err := route("a", "b", "x")
		if err != nil {
			return err
		}
		if !slices.Equal(r, []string{"a", "x", "b"}) {
			return fmt.Errorf("route %v", r)
		}
		return nil
	})
}

func mustCreate(t *testing.T, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// waitView polls check for at most 10 s.
func waitView(t *testing.T, v *View, check func() error) {
	t.Helper()
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err = check(); err == nil {
			return
		}
	}
	t.Fatal(err)
}
