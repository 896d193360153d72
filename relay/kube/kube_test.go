package kube

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
