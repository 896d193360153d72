package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
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
}

// +kubebuilder:rbac:groups=hoplink.dev,resources=chains,verbs=get;list;watch
// +kubebuilder:rbac:groups=hoplink.dev,resources=chains/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *ChainReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ch v1alpha1.Chain
	if err := r.Get(ctx, req.NamespacedName, &ch); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopRouting(req.String())
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.Routes != nil && ch.Spec.Mode.Routed() {
		r.Routes.Upsert(&ch, manifest.Route)
	} else {
		r.stopRouting(req.String())
	}
	status := ch.Status.DeepCopy()
	status.ObservedGeneration = ch.Generation
	cond := r.check(ctx, &ch, status)
	cond.Type, cond.ObservedGeneration = conditionReady, ch.Generation
	meta.SetStatusCondition(&status.Conditions, cond)
	return ctrl.Result{}, patchStatus(ctx, r.Client, &ch, &ch.Status, status)
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
	var relays v1alpha1.RelayNodeList
	if err := r.List(ctx, &relays, client.InNamespace(ch.Namespace)); err != nil {
		return metav1.Condition{Status: metav1.ConditionUnknown, Reason: ReasonListFailed, Message: err.Error()}
	}
	byName := map[string]*v1alpha1.RelayNode{}
	for i := range relays.Items {
		byName[relays.Items[i].Name] = &relays.Items[i]
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
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonRelayNotReady,
			Message: fmt.Sprintf("RelayNode %s on the route %s not ready; see `kubectl -n %s get relaynodes %s`",
				quoteJoin(notReady), map[bool]string{true: "is", false: "are"}[len(notReady) == 1], ch.Namespace, strings.Join(notReady, " "))}
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

// indexChainRelays indexes Chains by every RelayNode they name.
const indexChainRelays = "hoplink.chain.relays"

// SetupWithManager registers the reconciler; a RelayNode change requeues
// the Chains that name it.
func (r *ChainReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.Chain{}, indexChainRelays, func(o client.Object) []string {
		var names []string
		for _, ref := range chainRefs(o.(*v1alpha1.Chain)) {
			if !slices.Contains(names, ref.name) {
				names = append(names, ref.name)
			}
		}
		return names
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Chain{}).
		Watches(&v1alpha1.RelayNode{}, enqueueReferrers(mgr.GetClient(), &v1alpha1.ChainList{}, indexChainRelays)).
		Complete(r)
}
