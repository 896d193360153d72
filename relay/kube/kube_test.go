package kube

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A sidecar's entry Tunnels listen on the pod's loopback unless they name
// an address; Tunnels of chains it does not enter are left alone.
func TestOnLoopback(t *testing.T) {
	tunnel := func(name, chain, addr string) v1alpha1.Tunnel {
		return v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.TunnelSpec{Chain: chain, Listen: &v1alpha1.TunnelListen{Address: addr, Port: 9000}}}
	}
	chains := []v1alpha1.Chain{
		{ObjectMeta: metav1.ObjectMeta{Name: "from-web"}, Spec: v1alpha1.ChainSpec{Entry: "web", Exit: "la"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "la"}},
	}
	in := []v1alpha1.Tunnel{tunnel("a", "from-web", ""), tunnel("b", "from-web", "0.0.0.0"), tunnel("c", "other", "")}
	out := onLoopback(in, chains, "web")
	for i, want := range []string{"127.0.0.1", "0.0.0.0", ""} {
		if got := out[i].Spec.Listen.Address; got != want {
			t.Errorf("Tunnel %s listens on %q, want %q", out[i].Name, got, want)
		}
	}
	if in[0].Spec.Listen.Address != "" {
		t.Error("onLoopback changed the cache's object")
	}
}

// listOnly is a cache whose lists come from a fake client.
type listOnly struct {
	cache.Cache
	r client.Reader
}

func (l listOnly) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return l.r.List(ctx, list, opts...)
}

// A relay started with a name its namespace lacks says which it has that
// is near.
func TestMissingRelayNodeSuggestsANear(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for _, n := range []string{"hk", "seattle"} {
		objs = append(objs, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: n}})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	k := &Relay{o: Options{Namespace: "edge", Name: "seatle", Log: slog.New(slog.DiscardHandler)}, cache: listOnly{r: c}}
	_, err := k.manifests(context.Background())
	if err == nil || !strings.Contains(err.Error(), `RelayNode seatle is not in namespace edge`) || !strings.HasSuffix(err.Error(), `; did you mean "seattle"?`) {
		t.Errorf("err %v", err)
	}
}
