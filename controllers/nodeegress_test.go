package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// relayArgs waits for rn's DaemonSet and says whether its relays refuse
// their node.
func refusesNode(t *testing.T, ns, name string, want bool) {
	t.Helper()
	eventually(t, fmt.Sprintf("relay %s/%s runs with --refuse-node-egress: %v", ns, name, want), func() error {
		var ds appsv1.DaemonSet
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: RelayObjectName(name)}, &ds); err != nil {
			return err
		}
		if got := slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--refuse-node-egress"); got != want {
			return fmt.Errorf("args %v", ds.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})
}

// TestHostNetworkRelaysRefuseTheirNode: a host-network relay reaches its
// node (loopback, metadata, the node's addresses) for a Tunnel only where
// its namespace is labelled hoplink.dev/egress-host=true; the label, added
// or removed, reaches the DaemonSet at once. Pod-network relays reach what
// their namespace's pods reach, and are left alone.
func TestHostNetworkRelaysRefuseTheirNode(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	create(t, relayNode(ns, "egress-host", listenPort(7600)))
	create(t, relayNode(ns, "egress-pod", listenPort(7610), func(rn *v1alpha1.RelayNode) { rn.Spec.HostNetwork = ptr.To(false) }))
	refusesNode(t, ns, "egress-host", true)
	refusesNode(t, ns, "egress-pod", false)

	setLabel := func(v string) {
		var n corev1.Namespace
		if err := k8s.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
			t.Fatal(err)
		}
		if v == "" {
			delete(n.Labels, v1alpha1.LabelEgressHost)
		} else {
			n.Labels[v1alpha1.LabelEgressHost] = v
		}
		if err := k8s.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	setLabel("true")
	refusesNode(t, ns, "egress-host", false)
	setLabel("")
	refusesNode(t, ns, "egress-host", true)
	refusesNode(t, ns, "egress-pod", false)
}

// TestRefusesNodeEgress: who runs with --refuse-node-egress.
func TestRefusesNodeEgress(t *testing.T) {
	hostNet := relayNode("a", "r")
	podNet := relayNode("a", "r", func(rn *v1alpha1.RelayNode) { rn.Spec.HostNetwork = ptr.To(false) })
	sidecar := sidecarRelay("a", "r")
	ext := relayNode("a", "r", external("relay.example:7401"))
	for _, c := range []struct {
		what   string
		policy RelayPolicy
		rn     *v1alpha1.RelayNode
		want   bool
	}{
		{"host network, scoped install", RelayPolicy{}, hostNet, true},
		{"host network, any", RelayPolicy{NodeEgress: PrivilegedAny}, hostNet, false},
		{"pod network", RelayPolicy{}, podNet, false},
		{"sidecar", RelayPolicy{}, sidecar, false},
		{"external", RelayPolicy{}, ext, false},
	} {
		got, err := c.policy.refusesNodeEgress(context.Background(), nil, c.rn)
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.what, got, err, c.want)
		}
	}
}
