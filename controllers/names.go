// Package controllers reconciles hoplink's CRDs: a RelayNode becomes a relay
// DaemonSet with its certificate, ServiceAccount and RBAC; a Chain is checked
// against the RelayNodes it names; a Tunnel gets a Service in front of its
// entry relays. One reconciler per kind, as kubebuilder lays them out.
package controllers

import (
	"context"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

const (
	managerName    = "hoplink-operator"
	labelManagedBy = "app.kubernetes.io/managed-by"
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	// LabelRelayNode marks the pods (and the objects) of one RelayNode; a
	// Tunnel's Service selects its entry relay's pods by it.
	LabelRelayNode = v1alpha1.LabelRelayNode

	conditionReady = "Ready"
)

// RelayObjectName names what the operator makes for a RelayNode: its
// DaemonSet, ServiceAccount, Role, RoleBinding and certificate Secret.
func RelayObjectName(relay string) string { return v1alpha1.RelayObjectName(relay) }

func relayLabels(relay string) map[string]string {
	return map[string]string{
		labelName:      "hoplink",
		labelComponent: "relay",
		labelManagedBy: managerName,
		LabelRelayNode: relay,
	}
}

// MetricsPort is where a relay serves /metrics, /healthz and /readyz: the
// relay port plus one, so relays that share a node's network do not collide.
func MetricsPort(rn *v1alpha1.RelayNode) int32 { return rn.Spec.MetricsPort() }

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// enqueueReferrers maps a changed object to the objects of list's kind in its
// namespace whose field index names it: the Chains that route through a
// RelayNode, the Tunnels that ride a Chain.
func enqueueReferrers(c client.Client, list client.ObjectList, index string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := c.List(ctx, l, client.InNamespace(o.GetNamespace()), client.MatchingFields{index: o.GetName()}); err != nil {
			log.FromContext(ctx).Error(err, "list referrers", "index", index)
			return nil
		}
		var out []reconcile.Request
		meta.EachListItem(l, func(item runtime.Object) error {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item.(client.Object))})
			return nil
		})
		return out
	})
}

// patchStatus gives obj the wanted status (current points at obj's) and
// patches it, only when it differs, so that a reconcile with nothing to
// change costs no API write. Conditions set with meta.SetStatusCondition keep
// their transition time while unchanged, so they compare equal. Nor is
// the same status written again over the same version of obj, from a
// cache that has not delivered the first write yet (ownWrites).
func patchStatus[S any](ctx context.Context, c client.Client, obj client.Object, current, want *S) error {
	if equality.Semantic.DeepEqual(current, want) || alreadyWritten(obj, "status", want) {
		return nil
	}
	over := obj.GetResourceVersion()
	orig := obj.DeepCopyObject().(client.Object)
	*current = *want
	if err := c.Status().Patch(ctx, obj, client.MergeFrom(orig)); err != nil {
		return err
	}
	written(obj, "status", over, want)
	return nil
}
