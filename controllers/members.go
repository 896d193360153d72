package controllers

import (
	"context"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// Member labels (v1alpha1.MemberLabel) say which relays read an object; a
// relay watches only what carries its own. Who reads what:
//
//   - a Chain: the relays its spec names (manifest.Named);
//   - a Tunnel: the relays its Chain's labels name, and those its spec
//     names (a relay about to gain the Chain has its Tunnels first);
//   - a RelayNode: itself, and every relay of every Chain it is in, by the
//     Chains' specs or labels (the sidecar relay's Service, and so its
//     EndpointSlices, the same).
//
// A relay that gains a Chain must find with it every RelayNode and Tunnel
// it needs, or it would drop the Chain as naming an unknown relay. So the
// Chain's labels are written last: a relay's label is added to a Chain only
// once the RelayNodes the Chain names and the Chain's Tunnels carry it
// (ChainReconciler.publishMembers), and relays act on a Chain's spec only
// when its labels say so (manifest.Current). A relay an edit adds to a
// Chain is labelled v1alpha1.MemberJoining first, so that it takes the
// Chain before the others route flows to it, and joined a moment later
// (joinDelay); a relay taken out keeps its label as long, for the flows
// already on their way to it. A new Chain, which no relay runs yet, is
// labelled joined for all its relays at once, once its RelayNodes carry
// their labels: its Tunnels reach its relays each in one write, as a new
// Tunnel of a running Chain does. Labels change only when membership
// does, so they add no writes in a steady state.

// setMembers makes the member labels of labels exactly want (relay ->
// value), and says whether anything changed.
func setMembers(labels map[string]string, want map[string]string) (map[string]string, bool) {
	changed := false
	for k := range labels {
		if name, ok := strings.CutPrefix(k, v1alpha1.LabelMemberPrefix); ok {
			if _, keep := want[name]; !keep {
				delete(labels, k)
				changed = true
			}
		}
	}
	for n, v := range want {
		if old, ok := labels[v1alpha1.MemberLabel(n)]; !ok || old != v {
			if labels == nil {
				labels = map[string]string{}
			}
			labels[v1alpha1.MemberLabel(n)] = v
			changed = true
		}
	}
	return labels, changed
}

// joined is the member labels of relays that are members, no phase.
func joined(names []string) map[string]string {
	out := make(map[string]string, len(names))
	for _, n := range names {
		out[n] = ""
	}
	return out
}

// patchMembers gives o the member labels of want, patching only when they
// differ from what it has.
func patchMembers(ctx context.Context, c client.Client, o client.Object, want map[string]string) error {
	orig := o.DeepCopyObject().(client.Object)
	labels, changed := setMembers(maps.Clone(o.GetLabels()), want)
	if !changed || alreadyWritten(o, "members", want) {
		return nil
	}
	over := o.GetResourceVersion()
	o.SetLabels(labels)
	if err := c.Patch(ctx, o, client.MergeFrom(orig)); err != nil {
		return err
	}
	written(o, "members", over, want)
	return nil
}

// memberValues are the member labels of labels, relay -> value.
func memberValues(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if name, ok := strings.CutPrefix(k, v1alpha1.LabelMemberPrefix); ok && name != "" {
			out[name] = v
		}
	}
	return out
}

// hasMembers says whether labels name every relay of names.
func hasMembers(labels map[string]string, names []string) bool {
	for _, n := range names {
		if _, ok := labels[v1alpha1.MemberLabel(n)]; !ok {
			return false
		}
	}
	return true
}

// chainMembers are the relays a Chain is with: those its spec names and
// those its labels still name.
func chainMembers(ch *v1alpha1.Chain) []string {
	out := append(manifest.Named(ch), manifest.Labelled(ch.Labels)...)
	slices.Sort(out)
	return slices.Compact(out)
}

// relayMembers are the relays that read a RelayNode: itself and the
// members of every Chain it is a member of.
func relayMembers(ctx context.Context, c client.Reader, rn *v1alpha1.RelayNode) ([]string, error) {
	var chains v1alpha1.ChainList
	// Read-only, and a relay may be in thousands of Chains: no copies.
	if err := c.List(ctx, &chains, client.InNamespace(rn.Namespace), client.MatchingFields{indexChainRelays: rn.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := []string{rn.Name}
	for i := range chains.Items {
		out = append(out, chainMembers(&chains.Items[i])...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// tunnelMembers are the relays that read a Tunnel: its Chain's members;
// none when the Chain does not exist.
func tunnelMembers(ctx context.Context, c client.Reader, t *v1alpha1.Tunnel) ([]string, error) {
	var ch v1alpha1.Chain
	err := c.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Chain}, &ch)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return chainMembers(&ch), nil
}

// membersReady says whether the RelayNodes a Chain names (those that
// exist) and, with tunnels, its Tunnels carry the member labels of names,
// so that the Chain may carry them too. A new Chain, which no relay runs,
// need not wait for its Tunnels: a relay that takes it without them opens
// nothing for it, and takes each as its labels come, as it takes a new
// Tunnel of a Chain it runs.
func membersReady(ctx context.Context, c client.Reader, ch *v1alpha1.Chain, names []string, tunnels bool) (bool, error) {
	for _, n := range names {
		var rn v1alpha1.RelayNode
		err := c.Get(ctx, types.NamespacedName{Namespace: ch.Namespace, Name: n}, &rn)
		if apierrors.IsNotFound(err) {
			continue // the Chain's condition says so; no relay of that name reads it
		}
		if err != nil {
			return false, err
		}
		if !hasMembers(rn.Labels, names) {
			return false, nil
		}
	}
	if !tunnels {
		return true, nil
	}
	var tl v1alpha1.TunnelList
	if err := c.List(ctx, &tl, client.InNamespace(ch.Namespace), client.MatchingFields{indexTunnelChain: ch.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return false, err
	}
	for i := range tl.Items {
		if !hasMembers(tl.Items[i].Labels, names) {
			return false, nil
		}
	}
	return true, nil
}

// enqueueChainMembers maps a Chain to the RelayNodes it is with, before and
// after a change, so they relabel themselves; only changes of membership
// pass, not the Chain's status writes.
func enqueueChainMembers() (handler.EventHandler, predicate.Predicate) {
	h := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ch := o.(*v1alpha1.Chain)
		var out []reconcile.Request
		for _, n := range chainMembers(ch) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ch.Namespace, Name: n}})
		}
		return out
	})
	p := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !slices.Equal(chainMembers(e.ObjectOld.(*v1alpha1.Chain)), chainMembers(e.ObjectNew.(*v1alpha1.Chain)))
	}}
	return h, p
}

// enqueueTunnelChain maps a Tunnel to its Chain (before and after a
// change), whose labels may wait for the Tunnel's.
func enqueueTunnelChain() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		t := o.(*v1alpha1.Tunnel)
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Chain}}}
	})
}
