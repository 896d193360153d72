package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// LabelPrivilegedRelays, set to "true" on a namespace, lets its RelayNodes
// run relay pods on the host network or with a TUN device (as root, with
// NET_ADMIN) when the operator runs with --privileged-relays=namespace-label.
const LabelPrivilegedRelays = "hoplink.dev/privileged-relays"

// LabelControlPlaneRelays, set to "true" on a namespace, lets its
// RelayNodes tolerate the control-plane taint or select control-plane
// nodes: their relays would share a node with the API server and etcd.
const LabelControlPlaneRelays = "hoplink.dev/control-plane-relays"

// Taints and labels of control-plane nodes (kubeadm's, and the name it
// used before 1.24).
var controlPlaneKeys = []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}

// controlPlaneAsked names the field of rn that places its DaemonSet's
// relays on control-plane nodes ("" when none does): a toleration of their
// taint (or of every taint), or a node selector on their label. A
// sidecar's pods are scheduled as their own spec says.
func controlPlaneAsked(rn *v1alpha1.RelayNode) string {
	if rn.Spec.IsSidecar() {
		return ""
	}
	for i, t := range rn.Spec.Tolerations {
		if (t.Key == "" && t.Operator == corev1.TolerationOpExists) || slices.Contains(controlPlaneKeys, t.Key) {
			return fmt.Sprintf("spec.tolerations[%d] (key %q)", i, t.Key)
		}
	}
	for _, k := range controlPlaneKeys {
		if _, ok := rn.Spec.NodeSelector[k]; ok {
			return fmt.Sprintf("spec.nodeSelector %q", k)
		}
	}
	return ""
}

// Who may run privileged relays (--privileged-relays).
const (
	PrivilegedNamespaceLabel = "namespace-label" // namespaces labelled LabelPrivilegedRelays=true
	PrivilegedAny            = "any"             // every namespace
)

// RelayPolicy is what the operator lets a RelayNode ask for: anyone who may
// create a RelayNode in a namespace gets a DaemonSet, so its image, the host
// network and TUN devices are the operator's to allow, not the RelayNode's.
type RelayPolicy struct {
	// Image is the operator's relay image, always allowed.
	Image string
	// AllowedImages are prefixes of other images a RelayNode's spec.image
	// may name ("registry.example/hoplink:" allows every tag).
	AllowedImages []string
	// Privileged is PrivilegedNamespaceLabel (the default) or PrivilegedAny.
	Privileged string
	// NodeEgress says where host-network relays may reach their node for
	// a Tunnel: PrivilegedNamespaceLabel (the default: namespaces labelled
	// v1alpha1.LabelEgressHost=true) or PrivilegedAny (everywhere, as
	// before the policy).
	NodeEgress string
	// NamespaceLabels: the operator reads namespaces' labels (a
	// cluster-wide install). A namespace-scoped one cannot, and its
	// host-network relays refuse the node unless NodeEgress is any.
	NamespaceLabels bool
}

// refusesNodeEgress says whether rn's relays run with --refuse-node-egress:
// host-network DaemonSet relays of a namespace not allowed the node's
// network. Pod-network relays and sidecars reach what any pod of their
// namespace reaches (their loopback is their pod's), and external relays
// run elsewhere.
func (p RelayPolicy) refusesNodeEgress(ctx context.Context, reader client.Reader, rn *v1alpha1.RelayNode) (bool, error) {
	if rn.Spec.External || rn.Spec.IsSidecar() || (rn.Spec.HostNetwork != nil && !*rn.Spec.HostNetwork) || p.NodeEgress == PrivilegedAny {
		return false, nil
	}
	if !p.NamespaceLabels {
		return true, nil
	}
	var ns corev1.Namespace
	if err := reader.Get(ctx, types.NamespacedName{Name: rn.Namespace}, &ns); err != nil {
		return false, fmt.Errorf("read namespace %s: %w", rn.Namespace, err)
	}
	return ns.Labels[v1alpha1.LabelEgressHost] != "true", nil
}

// refusal is why a RelayNode may not run as it asks: a condition reason and
// a message that names the field and the fix.
type refusal struct{ reason, message string }

// check says whether rn may run, in a namespace with these labels. One
// policy for every form a relay takes: a sidecar runs its RelayNode's image
// in the pods it is injected into, and with spec.tun as root with NET_ADMIN
// and /dev/net/tun, as a DaemonSet's relay would; only the host network is
// not a sidecar's to ask for (the webhook refuses host-network pods).
// External relays run nothing here.
func (p RelayPolicy) check(rn *v1alpha1.RelayNode, nsLabels map[string]string) *refusal {
	if rn.Spec.External {
		return nil
	}
	if img := rn.Spec.Image; img != "" && img != p.Image && !slices.ContainsFunc(p.AllowedImages, func(pre string) bool { return strings.HasPrefix(img, pre) }) {
		allowed := append([]string{p.Image}, p.AllowedImages...)
		return &refusal{ReasonImageNotAllowed, fmt.Sprintf("spec.image %q is not an image this operator runs (allowed: %s, and images starting with the others); "+
			"remove spec.image to run the operator's, or have its admin allow it (hoplink operator --allowed-relay-images, chart value relay.allowedImages)",
			img, strings.Join(allowed, ", "))}
	}
	if p.Privileged == PrivilegedAny {
		return nil
	}
	if key := controlPlaneAsked(rn); key != "" && nsLabels[LabelControlPlaneRelays] != "true" {
		return &refusal{ReasonControlPlaneNotAllowed, fmt.Sprintf("%s would run relay pods on control-plane nodes (beside the API server and etcd), which namespace %q does not allow: "+
			"remove it, or have the cluster's admin label the namespace (kubectl label namespace %s %s=true)", key, rn.Namespace, rn.Namespace, LabelControlPlaneRelays)}
	}
	if nsLabels[LabelPrivilegedRelays] == "true" {
		return nil
	}
	fix := fmt.Sprintf("label the namespace (kubectl label namespace %s %s=true) if its RelayNodes may run privileged relays", rn.Namespace, LabelPrivilegedRelays)
	sidecar := rn.Spec.IsSidecar()
	if rn.Spec.TUN {
		what := "relay pods"
		if sidecar {
			what = "the sidecar relay of every pod it is injected into"
		}
		return &refusal{ReasonPrivilegesNotAllowed, fmt.Sprintf("spec.tun runs %s as root with NET_ADMIN, which namespace %q does not allow: %s, or remove spec.tun", what, rn.Namespace, fix)}
	}
	if !sidecar && (rn.Spec.HostNetwork == nil || *rn.Spec.HostNetwork) {
		return &refusal{ReasonPrivilegesNotAllowed, fmt.Sprintf("spec.hostNetwork (true unless set) runs relay pods on their nodes' network, which namespace %q does not allow: %s, or set spec.hostNetwork: false", rn.Namespace, fix)}
	}
	return nil
}

// Refusal checks rn against the policy, reading its namespace's labels
// through reader when they matter. It returns the condition reason and
// message of a refusal ("" when rn may run).
func (p RelayPolicy) Refusal(ctx context.Context, reader client.Reader, rn *v1alpha1.RelayNode) (reason, message string, err error) {
	var labels map[string]string
	if p.Privileged != PrivilegedAny {
		var ns corev1.Namespace
		if err := reader.Get(ctx, types.NamespacedName{Name: rn.Namespace}, &ns); err != nil {
			return "", "", fmt.Errorf("read namespace %s: %w", rn.Namespace, err)
		}
		labels = ns.Labels
	}
	if ref := p.check(rn, labels); ref != nil {
		return ref.reason, ref.message, nil
	}
	return "", "", nil
}
