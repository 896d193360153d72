package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/routectl"
)

// ChainReconciler checks a Chain against the RelayNodes it names and
// publishes the route relays use. Static chains get spec.route; sum and pipe
// chains are routed by the route controller (Routes), whose rounds this
// reconciler starts, updates and stops, and which writes status.route,
// latency and candidates.
type ChainReconciler struct {
	client.Client
	// Routes runs the rounds of routed chains; nil leaves them unrouted.
	Routes *routectl.Controller
	writer *routeWriter
	phases phases
	// first holds back a new Chain's first status while its relays come
	// up (firstStatus).
	first firstStatus
}

// +kubebuilder:rbac:groups=hoplink.dev,resources=chains,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hoplink.dev,resources=chains/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *ChainReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ch v1alpha1.Chain
	if err := r.Get(ctx, req.NamespacedName, &ch); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopRouting(req.String())
			r.phases.forget(req.String())
			r.first.forget(req.String())
			forgetWrites(&v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}})
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.Routes != nil && ch.Spec.Mode.Routed() && !r.routedElsewhere(ctx, &ch) {
		r.Routes.Upsert(&ch, manifest.Route)
	} else {
		r.stopRouting(req.String())
	}
	recheck, err := r.publishMembers(ctx, &ch)
	if err != nil {
		return ctrl.Result{}, err
	}
	status := ch.Status.DeepCopy()
	status.ObservedGeneration = ch.Generation
	cond := r.check(ctx, &ch, status)
	cond.Type, cond.ObservedGeneration = conditionReady, ch.Generation
	// A new Chain whose relays are still coming up says nothing for a
	// moment: most are Ready before it is over, one status write each.
	if wait := r.first.hold(req.String(), ch.Status.Conditions, cond, cond.Reason == ReasonRelayNotReady); wait > 0 {
		return ctrl.Result{RequeueAfter: sooner(recheck, wait)}, nil
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	return ctrl.Result{RequeueAfter: recheck}, patchStatus(ctx, r.Client, &ch, &ch.Status, status)
}

// routedElsewhere reports whether another cluster's operator routes ch: a
// Chain of the clusterset whose entry is another cluster's gateway. Flows
// carry their route and the relays here admit any route the spec allows,
// so the copy here needs no rounds: each cluster of a set would otherwise
// measure every pair's Chain. (A Chain written by hand whose entry is
// external is routed here as ever: its relays may run outside any cluster.)
func (r *ChainReconciler) routedElsewhere(ctx context.Context, ch *v1alpha1.Chain) bool {
	if ch.Labels[clusterset.LabelManaged] != "true" {
		return false
	}
	var entry v1alpha1.RelayNode
	return r.Get(ctx, types.NamespacedName{Namespace: ch.Namespace, Name: ch.Spec.Entry}, &entry) == nil && entry.Spec.External
}

// joinDelay is how long relays an edit added to a Chain have to take it
// before the others act on the edit, and relays it took out keep it.
const joinDelay = 2 * time.Second

// publishMembers labels the Chain for the relays its spec names, which
// then see it, in two steps: a relay the spec newly names is labelled
// joining once the RelayNodes and Tunnels it needs with the Chain carry
// its label (their label changes requeue the Chain); joinDelay later its
// label is joined, and the labels of relays the spec no longer names go.
// A Chain no relay is labelled for yet, a new one, is labelled joined in
// one step, without waiting for its Tunnels' labels: no relay acts on it,
// so none can send a flow along it to a relay that has not taken it, and
// its Tunnels reach all its relays each in one write, as a new Tunnel on a
// Chain whose relays run does. The joining step was a second write of
// every Chain, 10,000 at issue 41's size, and waiting for the Tunnels
// (created after their Chains by an apply) left every Chain's labels to
// the end of the run.
// It returns when to look again.
func (r *ChainReconciler) publishMembers(ctx context.Context, ch *v1alpha1.Chain) (time.Duration, error) {
	key := client.ObjectKeyFromObject(ch).String()
	named := manifest.Named(ch)
	have := memberValues(ch.Labels)
	want := joined(named)
	settled := true
	var added []string
	for _, n := range named {
		switch v, ok := have[n]; {
		case !ok:
			added = append(added, n)
		case v == v1alpha1.MemberJoining:
			settled = false
		}
	}
	for n := range have {
		if _, ok := want[n]; !ok {
			settled = false // leaving
		}
	}
	if len(added) > 0 {
		if ready, err := membersReady(ctx, r.Client, ch, named, len(have) > 0); err != nil || !ready {
			return 0, err
		}
		if len(have) == 0 {
			if err := patchMembers(ctx, r.Client, ch, want); err != nil {
				return 0, err
			}
			r.phases.forget(key)
			return 0, nil
		}
		next := maps.Clone(have)
		for _, n := range added {
			next[n] = v1alpha1.MemberJoining
		}
		if err := patchMembers(ctx, r.Client, ch, next); err != nil {
			return 0, err
		}
		r.phases.start(key, true)
		return joinDelay, nil
	}
	if settled {
		r.phases.forget(key)
		return 0, nil
	}
	if left := joinDelay - r.phases.start(key, false); left > 0 {
		return left, nil
	}
	if err := patchMembers(ctx, r.Client, ch, want); err != nil {
		return 0, err
	}
	r.phases.forget(key)
	return 0, nil
}

// phases remembers when each Chain's labels last changed membership: an
// operator that restarts waits joinDelay again, which is safe.
type phases struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// start returns how long ago key's phase started, starting it now when
// restart is set or none is known.
func (p *phases) start(key string, restart bool) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since == nil {
		p.since = map[string]time.Time{}
	}
	t, ok := p.since[key]
	if restart || !ok {
		t = time.Now()
		p.since[key] = t
	}
	return time.Since(t)
}

func (p *phases) forget(key string) {
	p.mu.Lock()
	delete(p.since, key)
	p.mu.Unlock()
}

func (r *ChainReconciler) stopRouting(key string) {
	if r.Routes != nil {
		r.Routes.Remove(key)
		r.writer.forget(key)
	}
}

// check fills status.route for static chains and says whether the chain
// can carry flows, and if not, what to do about it.
func (r *ChainReconciler) check(ctx context.Context, ch *v1alpha1.Chain, status *v1alpha1.ChainStatus) metav1.Condition {
	// The relays it names, each read alone: a namespace may hold
	// thousands, and every Chain is checked again when one changes.
	byName := map[string]*v1alpha1.RelayNode{}
	for _, ref := range chainRefs(ch) {
		if _, seen := byName[ref.name]; seen {
			continue
		}
		var rn v1alpha1.RelayNode
		err := r.Get(ctx, types.NamespacedName{Namespace: ch.Namespace, Name: ref.name}, &rn)
		switch {
		case err == nil:
			byName[ref.name] = &rn
		case apierrors.IsNotFound(err):
			byName[ref.name] = nil
		default:
			return metav1.Condition{Status: metav1.ConditionUnknown, Reason: ReasonListFailed, Message: err.Error()}
		}
	}
	for _, ref := range chainRefs(ch) {
		if byName[ref.name] == nil {
			return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonRelayNotFound,
				Message: fmt.Sprintf("%s names RelayNode %q, which does not exist in namespace %q", ref.field, ref.name, ch.Namespace)}
		}
	}
	if ch.Spec.Mode == v1alpha1.ModeStatic || ch.Spec.Mode == "" {
		status.Route = slices.Clone(ch.Spec.Route)
	}
	if ch.Spec.Mode.Routed() && ch.Labels[clusterset.LabelManaged] == "true" && byName[ch.Spec.Entry].Spec.External {
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonEntryElsewhere,
			Message: fmt.Sprintf("entry relay %q runs in another cluster, whose operator routes this Chain; relays here admit every route its spec allows", ch.Spec.Entry)}
	}
	// A routed chain's relays take spec.route until the route controller
	// has written one.
	route := status.Route
	if len(route) == 0 {
		route = ch.Spec.Route
	}
	if len(route) == 0 {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNoRoute,
			Message: fmt.Sprintf("mode %s: no route chosen yet; the route controller picks one once it has measured the links (see the Chain's events)", ch.Spec.Mode)}
	}
	var notReady []string
	for _, name := range route {
		if !meta.IsStatusConditionTrue(byName[name].Status.Conditions, conditionReady) {
			notReady = append(notReady, name)
		}
	}
	if len(notReady) > 0 {
		// The route's relays, not only those not ready: a message that
		// changed as each relay came up was a status write each, and a
		// recheck of every Tunnel of the Chain; kubectl shows which.
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonRelayNotReady,
			Message: fmt.Sprintf("not every RelayNode on the route (%s) is ready; see `kubectl -n %s get relaynodes %s`",
				quoteJoin(route), ch.Namespace, strings.Join(route, " "))}
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonRouteReady,
		Message: "every relay on route " + strings.Join(route, " -> ") + " is ready"}
}

type relayRef struct{ field, name string }

// chainRefs lists every RelayNode a Chain names, with the field naming it.
func chainRefs(ch *v1alpha1.Chain) []relayRef {
	refs := []relayRef{{"spec.entry", ch.Spec.Entry}, {"spec.exit", ch.Spec.Exit}}
	for i, v := range ch.Spec.Via {
		refs = append(refs, relayRef{fmt.Sprintf("spec.via[%d]", i), v})
	}
	for i, v := range ch.Spec.Route {
		refs = append(refs, relayRef{fmt.Sprintf("spec.route[%d]", i), v})
	}
	return refs
}

func quoteJoin(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// enqueueChainsOfRelay maps a RelayNode to the Chains that name it: all of
// them when it comes, goes, or its spec or readiness changes; when only its
// member labels change, the Chains still publishing theirs, which wait for
// those (publishMembers). A relay's labels change with each Chain it joins,
// thirty times at issue 31's size, and each change rechecked all its
// Chains for nothing.
func enqueueChainsOfRelay(c client.Client) handler.EventHandler {
	all := enqueueReferrers(c, &v1alpha1.ChainList{}, indexChainRelays)
	publishing := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var chains v1alpha1.ChainList
		if err := c.List(ctx, &chains, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexChainRelays: o.GetName()},
			client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "list Chains of a RelayNode")
			return nil
		}
		var out []reconcile.Request
		for i := range chains.Items {
			if ch := &chains.Items[i]; !maps.Equal(memberValues(ch.Labels), joined(manifest.Named(ch))) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(ch)})
			}
		}
		return out
	})
	return handler.Funcs{
		CreateFunc:  all.Create,
		DeleteFunc:  all.Delete,
		GenericFunc: all.Generic,
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() || ready(e.ObjectOld) != ready(e.ObjectNew) {
				all.Update(ctx, e, q)
				return
			}
			publishing.Update(ctx, e, q)
		},
	}
}

// indexChainRelays indexes Chains by every RelayNode they name or their
// member labels still name.
const indexChainRelays = "hoplink.chain.relays"

// SetupWithManager registers the reconciler; a RelayNode change requeues
// the Chains that name it, and a Tunnel's new labels its Chain (whose own
// may wait for them).
func (r *ChainReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.Chain{}, indexChainRelays, func(o client.Object) []string {
		return chainMembers(o.(*v1alpha1.Chain))
	}); err != nil {
		return err
	}
	self, selfUrgent := urgentSelf()
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Chain{}).
		Watches(&v1alpha1.Chain{}, self, selfUrgent).
		Watches(&v1alpha1.RelayNode{}, urgentWhen(enqueueChainsOfRelay(mgr.GetClient()), specOrMembers),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return specMembersOrReady(e.ObjectOld, e.ObjectNew)
			}})).
		Watches(&v1alpha1.Tunnel{}, urgentWhen(enqueueTunnelChain(), specOrMembers), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: chainWorkers}).
		Complete(r)
}
