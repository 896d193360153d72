package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
)

// ClusterSetRelaysReconciler keeps the Chains and Tunnels that carry the
// clusterset's services in the relays' namespace: the same in every
// cluster (clusterset.Tunnels, clusterset.Chains), with the listen ports
// each entry cluster gave its own Tunnels. It gives those of this cluster,
// from its range, once each (a Tunnel keeps its port while it exists), and
// counts them (Entry.Seq), so the other clusters can say which they copied
// (Report.Seen), and this cluster's clients are sent only over Tunnels
// whose exit holds them.
type ClusterSetRelaysReconciler struct {
	client.Client
	Set *clusterSet
}

// +kubebuilder:rbac:groups=hoplink.dev,resources=chains;tunnels,verbs=get;list;watch;create;update;patch;delete

// AnnotationSeq is the Entry.Seq of a Tunnel's listen port.
const AnnotationSeq = "mcs.hoplink.dev/seq"

func (r *ClusterSetRelaysReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	var relays v1alpha1.RelayNodeList
	if err := r.List(ctx, &relays, client.InNamespace(r.Set.ns)); err != nil {
		return ctrl.Result{}, err
	}
	var local, known []string
	for _, rn := range relays.Items {
		known = append(known, rn.Name)
		if !rn.Spec.External {
			local = append(local, rn.Name)
		}
	}
	slices.Sort(local)
	slices.Sort(known)
	r.Set.SetRelays(local, known)

	reports := r.Set.Reports()
	wanted := clusterset.Tunnels(r.Set.ns, reports, r.Set.Services())
	chains := clusterset.Chains(r.Set.ns, reports)

	var have v1alpha1.TunnelList
	if err := r.List(ctx, &have, client.InNamespace(r.Set.ns), client.MatchingLabels{clusterset.LabelManaged: "true"}); err != nil {
		return ctrl.Result{}, err
	}
	held := map[string]*v1alpha1.Tunnel{}
	for i := range have.Items {
		held[have.Items[i].Name] = &have.Items[i]
	}
	entries, err := r.allocate(wanted, held)
	if err != nil {
		return ctrl.Result{}, err
	}
	others := map[string]map[string]clusterset.Entry{} // cluster -> tunnel -> entry
	for _, rep := range reports[1:] {
		others[rep.Cluster] = map[string]clusterset.Entry{}
		for _, e := range rep.Entries {
			others[rep.Cluster][e.Tunnel] = e
		}
	}

	// Chains first: a Tunnel's relays read it once its Chain names them.
	keepChains := map[string]bool{}
	for i := range chains {
		keepChains[chains[i].Name] = true
		if err := r.applyChain(ctx, &chains[i]); err != nil {
			return ctrl.Result{}, err
		}
	}
	keep := map[string]bool{}
	written := map[string]map[string]bool{} // cluster -> tunnels of its entries held here
	for i := range wanted {
		w := &wanted[i]
		var e clusterset.Entry
		var ok bool
		if w.Entry == r.Set.self {
			e, ok = entries[w.Name]
		} else {
			e, ok = others[w.Entry][w.Name]
		}
		if !ok || !keepChains[w.Spec.Chain] {
			continue // its entry cluster has not given it a port yet
		}
		w.Spec.Listen.Port = e.Port
		w.Annotations[AnnotationSeq] = strconv.FormatInt(e.Seq, 10)
		keep[w.Name] = true
		if err := r.applyTunnel(ctx, &w.Tunnel, held[w.Name]); err != nil {
			return ctrl.Result{}, err
		}
		if written[w.Entry] == nil {
			written[w.Entry] = map[string]bool{}
		}
		written[w.Entry][w.Name] = true
	}
	for name, t := range held {
		if !keep[name] {
			if err := r.Delete(ctx, t); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
		}
	}
	var oldChains v1alpha1.ChainList
	if err := r.List(ctx, &oldChains, client.InNamespace(r.Set.ns), client.MatchingLabels{clusterset.LabelManaged: "true"}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range oldChains.Items {
		if !keepChains[oldChains.Items[i].Name] {
			if err := r.Delete(ctx, &oldChains.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
		}
	}
	r.Set.SetCopies(entries, seenOf(others, written))
	return ctrl.Result{}, nil
}

// allocate gives each wanted Tunnel entering here a listen port: the one it
// has, else the lowest free one of the range, with the next Seq.
func (r *ClusterSetRelaysReconciler) allocate(wanted []clusterset.Tunnel, held map[string]*v1alpha1.Tunnel) (map[string]clusterset.Entry, error) {
	out := map[string]clusterset.Entry{}
	used := map[int32]bool{}
	var seq int64
	for _, t := range held {
		if t.Labels[clusterset.LabelEntry] != r.Set.self || t.Spec.Listen == nil {
			continue
		}
		n, _ := strconv.ParseInt(t.Annotations[AnnotationSeq], 10, 64)
		seq = max(seq, n)
	}
	for _, w := range wanted {
		if w.Entry != r.Set.self {
			continue
		}
		if t := held[w.Name]; t != nil && t.Spec.Listen != nil && t.Spec.Listen.Port != 0 {
			n, _ := strconv.ParseInt(t.Annotations[AnnotationSeq], 10, 64)
			if n > 0 && !used[t.Spec.Listen.Port] {
				out[w.Name] = clusterset.Entry{Tunnel: w.Name, Port: t.Spec.Listen.Port, Seq: n}
				used[t.Spec.Listen.Port] = true
			}
		}
	}
	next := r.Set.o.Ports[0]
	for _, w := range wanted {
		if w.Entry != r.Set.self || out[w.Name].Port != 0 {
			continue
		}
		for next <= r.Set.o.Ports[1] && used[next] {
			next++
		}
		if next > r.Set.o.Ports[1] {
			return out, fmt.Errorf("the gateway's import ports %d-%d are all taken: widen --mcs-ports (chart multicluster.ports)", r.Set.o.Ports[0], r.Set.o.Ports[1])
		}
		seq++
		out[w.Name] = clusterset.Entry{Tunnel: w.Name, Port: next, Seq: seq}
		used[next] = true
	}
	return out, nil
}

// seenOf is, for each other cluster, the highest Seq such that every entry
// of its up to that one is held here.
func seenOf(others map[string]map[string]clusterset.Entry, written map[string]map[string]bool) map[string]int64 {
	out := map[string]int64{}
	for c, entries := range others {
		var seqs []clusterset.Entry
		for _, e := range entries {
			seqs = append(seqs, e)
		}
		slices.SortFunc(seqs, func(a, b clusterset.Entry) int { return int(a.Seq - b.Seq) })
		var upTo int64
		for _, e := range seqs {
			if !written[c][e.Tunnel] {
				break
			}
			upTo = e.Seq
		}
		if upTo > 0 {
			out[c] = upTo
		}
	}
	return out
}

func (r *ClusterSetRelaysReconciler) applyChain(ctx context.Context, want *v1alpha1.Chain) error {
	var got v1alpha1.Chain
	err := r.Get(ctx, client.ObjectKeyFromObject(want), &got)
	switch {
	case apierrors.IsNotFound(err):
		return r.Create(ctx, want)
	case err != nil:
		return err
	case got.Spec.Entry != want.Spec.Entry || got.Spec.Exit != want.Spec.Exit:
		// Immutable: made again.
		if err := r.Delete(ctx, &got); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return r.Create(ctx, want)
	}
	next := got.DeepCopy()
	next.Spec.Via, next.Spec.Mode = want.Spec.Via, want.Spec.Mode
	maps.Copy(next.Labels, want.Labels)
	if equality.Semantic.DeepEqual(&got, next) {
		return nil
	}
	// A patch of what differs: the Chain reconciler writes its labels too.
	return r.Patch(ctx, next, client.MergeFrom(&got))
}

func (r *ClusterSetRelaysReconciler) applyTunnel(ctx context.Context, want *v1alpha1.Tunnel, got *v1alpha1.Tunnel) error {
	if got == nil {
		err := r.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) {
			return nil // the cache is behind: the next round sees it
		}
		return err
	}
	// Compared as the API server stores them: with their defaults.
	w := want.DeepCopy()
	w.Default()
	next := got.DeepCopy()
	next.Spec = w.Spec
	maps.Copy(next.Labels, want.Labels)
	maps.Copy(next.Annotations, want.Annotations)
	if equality.Semantic.DeepEqual(got, next) {
		return nil
	}
	return r.Patch(ctx, next, client.MergeFrom(got))
}

func (r *ClusterSetRelaysReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{request(r.Set.ns + "/" + relaysKey)}
	})
	inNS := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == r.Set.ns })
	managed := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Set.ns && o.GetLabels()[clusterset.LabelManaged] == "true"
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("clusterset-relays").
		WatchesRawSource(r.Set.relays).
		Watches(&v1alpha1.RelayNode{}, one, builder.WithPredicates(inNS, predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Tunnel{}, one, builder.WithPredicates(managed, predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Chain{}, one, builder.WithPredicates(managed, predicate.GenerationChangedPredicate{})).
		Complete(r)
}
