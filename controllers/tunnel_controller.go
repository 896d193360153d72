package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
)

// TunnelReconciler puts a Service named as the Tunnel in front of the
// Tunnel's port on its chain's entry relay pods, so clients in the cluster
// reach it at NAME.NAMESPACE.svc:PORT.
type TunnelReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	// Reports are the entry relays' own word on whether they listen.
	Reports *relayReports
	// first holds back a new Tunnel's first status while its Chain comes
	// up (firstStatus).
	first firstStatus
}

// +kubebuilder:rbac:groups=hoplink.dev,resources=tunnels,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hoplink.dev,resources=tunnels/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete

func (r *TunnelReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var t v1alpha1.Tunnel
	if err := r.Get(ctx, req.NamespacedName, &t); err != nil {
		if apierrors.IsNotFound(err) {
			r.first.forget(req.String())
			forgetWrites(&v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}})
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The relays of its Chain read it, and may before they see the Chain
	// with a new member: its labels follow the Chain's spec at once.
	members, err := tunnelMembers(ctx, r.Client, &t)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := patchMembers(ctx, r.Client, &t, joined(members)); err != nil {
		return ctrl.Result{}, err
	}
	status := t.Status.DeepCopy()
	status.ObservedGeneration = t.Generation
	cond, err := r.reconcile(ctx, &t, status)
	if cond.Reason == "" { // a transient error, nothing to tell the user yet
		return ctrl.Result{}, err
	}
	if l, open := r.listening(ctx, &t); l != nil {
		l.ObservedGeneration = t.Generation
		meta.SetStatusCondition(&status.Conditions, *l)
		if open == 0 && cond.Status == metav1.ConditionTrue {
			// No entry relay listens: clients cannot connect, whatever
			// else is in place.
			cond = metav1.Condition{Status: metav1.ConditionFalse, Reason: l.Reason, Message: l.Message}
		}
	}
	var res ctrl.Result
	if t.Spec.Protocol == v1alpha1.ProtocolTUN {
		meta.RemoveStatusCondition(&status.Conditions, conditionLimited) // takes no limits
	} else {
		l, expires := r.Reports.limited(&t)
		l.ObservedGeneration = t.Generation
		meta.SetStatusCondition(&status.Conditions, l)
		if expires > 0 {
			res.RequeueAfter = expires + time.Second
		}
	}
	cond.Type, cond.ObservedGeneration = conditionReady, t.Generation
	// A new Tunnel whose Chain is still coming up says nothing for a
	// moment: most are Ready before it is over, one status write each.
	if wait := r.first.hold(req.String(), t.Status.Conditions, cond, err == nil && r.chainComingUp(ctx, &t, cond)); wait > 0 {
		return ctrl.Result{RequeueAfter: sooner(res.RequeueAfter, wait)}, nil
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	return res, errors.Join(err, patchStatus(ctx, r.Client, &t, &t.Status, status))
}

// chainComingUp says whether cond, a Tunnel's Ready condition, waits only
// for its Chain, which is itself coming up: held back as new, or waiting
// for its relays to be ready.
func (r *TunnelReconciler) chainComingUp(ctx context.Context, t *v1alpha1.Tunnel, cond metav1.Condition) bool {
	if cond.Reason != ReasonChainNotReady {
		return false
	}
	var ch v1alpha1.Chain
	if r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Chain}, &ch) != nil {
		return false
	}
	c := meta.FindStatusCondition(ch.Status.Conditions, conditionReady)
	return c == nil || c.Reason == ReasonRelayNotReady
}

// listening is the Tunnel's Listening condition from its entry relays'
// reports, and on how many the entry is open; nil before any answered or
// for a tun Tunnel (no listener).
func (r *TunnelReconciler) listening(ctx context.Context, t *v1alpha1.Tunnel) (*metav1.Condition, int) {
	if r.Reports == nil || t.Spec.Protocol == v1alpha1.ProtocolTUN {
		return nil, 0
	}
	var ch v1alpha1.Chain
	if r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Chain}, &ch) != nil {
		return nil, 0
	}
	return r.Reports.listening(t, ch.Spec.Entry)
}

func (r *TunnelReconciler) reconcile(ctx context.Context, t *v1alpha1.Tunnel, status *v1alpha1.TunnelStatus) (metav1.Condition, error) {
	var ch v1alpha1.Chain
	if err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.Chain}, &ch); err != nil {
		if !apierrors.IsNotFound(err) {
			return metav1.Condition{}, err
		}
		status.Address = ""
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonChainNotFound,
			Message: fmt.Sprintf("spec.chain names Chain %q, which does not exist in namespace %q", t.Spec.Chain, t.Namespace)}, r.deleteService(ctx, t)
	}
	if t.Spec.Protocol == v1alpha1.ProtocolTUN {
		return r.reconcileTUN(ctx, t, &ch, status)
	}
	if t.Labels[clusterset.LabelManaged] == "true" {
		return r.reconcileImport(ctx, t, &ch, status)
	}
	var entry v1alpha1.RelayNode
	if err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: ch.Spec.Entry}, &entry); err == nil && entry.Spec.IsSidecar() {
		return r.reconcileSidecarEntry(ctx, t, &ch, status)
	} else if err != nil && !apierrors.IsNotFound(err) {
		return metav1.Condition{}, err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: t.Name, Namespace: t.Namespace}}
	conflict := metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonServiceConflict,
		Message: fmt.Sprintf("Service %q exists and is not this Tunnel's; rename the Tunnel or that Service", t.Name)}
	if err := r.Get(ctx, client.ObjectKeyFromObject(svc), svc); err == nil && !metav1.IsControlledBy(svc, t) {
		status.Address = ""
		return conflict, nil
	}
	proto := corev1.ProtocolTCP
	if t.Spec.Protocol == v1alpha1.ProtocolUDP {
		proto = corev1.ProtocolUDP
	}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, svc, func() error {
		svc.Labels = map[string]string{labelName: "hoplink", labelComponent: "tunnel", labelManagedBy: managerName}
		svc.Spec.Selector = map[string]string{LabelRelayNode: ch.Spec.Entry}
		svc.Spec.IPFamilyPolicy = ptr.To(serviceFamilies(t.Spec.Listen.Address))
		svc.Spec.Ports = []corev1.ServicePort{{
			Name: string(t.Spec.Protocol), Protocol: proto,
			Port: t.Spec.Listen.Port, TargetPort: intstr.FromInt32(t.Spec.Listen.Port),
		}}
		return controllerutil.SetControllerReference(t, svc, r.Scheme)
	}); apierrors.IsAlreadyExists(err) {
		// The cache holds only Services the operator made: one it did not
		// make is seen when creating ours fails.
		status.Address = ""
		return conflict, nil
	} else if err != nil {
		status.Address = ""
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonServiceFailed,
			Message: fmt.Sprintf("cannot create or update Service %q: %v", t.Name, err)}, fmt.Errorf("Service %s: %w", t.Name, err)
	}
	status.Address = fmt.Sprintf("%s.%s.svc:%d", t.Name, t.Namespace, t.Spec.Listen.Port)

	if a, err := netip.ParseAddr(t.Spec.Listen.Address); err == nil && a.IsLoopback() {
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonLoopbackListen,
			Message: fmt.Sprintf("spec.listen.address %s is loopback: the entry relay opens it, but the Service cannot reach it; leave the address empty", a)}, nil
	}
	if c := chainNotReady(&ch); c != nil {
		return *c, nil
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: fmt.Sprintf("clients connect to %s; entry relay %q", status.Address, ch.Spec.Entry)}, nil
}

// serviceFamilies is the IP family policy of a Tunnel's Service: both
// families where the cluster has them while the entry relay listens on
// every address (a dual-stack socket), so clients of either reach it; one
// otherwise, as an address binds one family.
func serviceFamilies(listen string) corev1.IPFamilyPolicy {
	if a, err := netip.ParseAddr(listen); listen == "" || (err == nil && a.IsUnspecified()) {
		return corev1.IPFamilyPolicyPreferDualStack
	}
	return corev1.IPFamilyPolicySingleStack
}

// reconcileSidecarEntry readies a Tunnel whose chain starts at sidecar
// relays: each replica listens in its own pod, so no Service stands in
// front; on the pod's loopbacks, 127.0.0.1 and ::1 where the pod has it
// (status localhost:PORT), unless spec.listen.address names one address.
func (r *TunnelReconciler) reconcileSidecarEntry(ctx context.Context, t *v1alpha1.Tunnel, ch *v1alpha1.Chain, status *v1alpha1.TunnelStatus) (metav1.Condition, error) {
	if err := r.deleteService(ctx, t); err != nil {
		return metav1.Condition{}, err
	}
	addr := t.Spec.Listen.Address
	if addr == "" {
		addr = "localhost"
	}
	status.Address = net.JoinHostPort(addr, strconv.Itoa(int(t.Spec.Listen.Port)))
	if c := chainNotReady(ch); c != nil {
		return *c, nil
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: fmt.Sprintf("apps in the pods labelled %s=%s connect to %s (their sidecar relay)", LabelRelayNode, ch.Spec.Entry, status.Address)}, nil
}

// reconcileImport readies a Tunnel of the clusterset, which carries a port
// of an imported service: clients reach it at the import's clusterset IP,
// whose EndpointSlices list the gateway relays at its port, so no Service
// of its own stands in front.
func (r *TunnelReconciler) reconcileImport(ctx context.Context, t *v1alpha1.Tunnel, ch *v1alpha1.Chain, status *v1alpha1.TunnelStatus) (metav1.Condition, error) {
	if err := r.deleteService(ctx, t); err != nil {
		return metav1.Condition{}, err
	}
	status.Address = ""
	if c := chainNotReady(ch); c != nil {
		return *c, nil
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: fmt.Sprintf("carries port %s of the imported service %s from cluster %s to cluster %s",
			t.Annotations[clusterset.AnnotationPort], t.Annotations[clusterset.AnnotationService], t.Labels[clusterset.LabelEntry], t.Labels[clusterset.LabelSource])}, nil
}

// reconcileTUN readies a tun Tunnel: no Service (nothing listens), and the
// address is the entry relay's on the device.
func (r *TunnelReconciler) reconcileTUN(ctx context.Context, t *v1alpha1.Tunnel, ch *v1alpha1.Chain, status *v1alpha1.TunnelStatus) (metav1.Condition, error) {
	status.Address = t.Spec.TUN.Address
	if err := r.deleteService(ctx, t); err != nil {
		return metav1.Condition{}, err
	}
	if c := chainNotReady(ch); c != nil {
		return *c, nil
	}
	if c, err := r.tunNotAllowed(ctx, t, ch); c != nil || err != nil {
		return *c, err
	}
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: fmt.Sprintf("entry relay %q routes %v into its device (%s mode)", ch.Spec.Entry, t.Spec.TUN.Routes, t.Spec.TUN.Mode)}, nil
}

// tunNotAllowed names the relays that must open a device for the Tunnel
// (its entry; in packet mode its exit too) but whose pods may not: a
// RelayNode without spec.tun. External relays run elsewhere, with whatever
// privileges they were given, so they are taken at their word.
func (r *TunnelReconciler) tunNotAllowed(ctx context.Context, t *v1alpha1.Tunnel, ch *v1alpha1.Chain) (*metav1.Condition, error) {
	need := []string{ch.Spec.Entry}
	if t.Spec.TUN.Mode == v1alpha1.TunPacket && ch.Spec.Exit != ch.Spec.Entry {
		need = append(need, ch.Spec.Exit)
	}
	var missing []string
	for _, name := range need {
		var rn v1alpha1.RelayNode
		if err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: name}, &rn); err != nil {
			if apierrors.IsNotFound(err) {
				continue // the Chain's condition says so
			}
			return &metav1.Condition{}, err
		}
		if !rn.Spec.TUN && !rn.Spec.External {
			missing = append(missing, strconv.Quote(name))
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	return &metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonTUNNotAllowed,
		Message: fmt.Sprintf("RelayNode %s may not open TUN devices: set spec.tun: true on it (its pods then run with CAP_NET_ADMIN and /dev/net/tun)", strings.Join(missing, ", "))}, nil
}

func chainNotReady(ch *v1alpha1.Chain) *metav1.Condition {
	c := meta.FindStatusCondition(ch.Status.Conditions, conditionReady)
	if c != nil && c.Status == metav1.ConditionTrue {
		return nil
	}
	// Not the Chain's own message, which names the relays not ready yet
	// and so changes as each comes up: copied, every change was a write
	// of every Tunnel of the Chain, and a recheck of each.
	return &metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonChainNotReady,
		Message: fmt.Sprintf("Chain %q is not ready; its status says why: `kubectl -n %s get chain %s -o wide`", ch.Name, ch.Namespace, ch.Name)}
}

func (r *TunnelReconciler) deleteService(ctx context.Context, t *v1alpha1.Tunnel) error {
	var svc corev1.Service
	err := r.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: t.Name}, &svc)
	if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(&svc, t)) {
		return nil
	}
	if err != nil {
		return err
	}
	return client.IgnoreNotFound(r.Delete(ctx, &svc))
}

// indexTunnelChain indexes Tunnels by the Chain they ride.
const indexTunnelChain = "hoplink.tunnel.chain"

// SetupWithManager registers the reconciler; a Chain change requeues its
// Tunnels.
func (r *TunnelReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.Tunnel{}, indexTunnelChain,
		func(o client.Object) []string { return []string{o.(*v1alpha1.Tunnel).Spec.Chain} }); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Reports != nil {
		b = b.WatchesRawSource(source.Channel(r.Reports.tunnels, &handler.EnqueueRequestForObject{}))
	}
	self, selfUrgent := urgentSelf()
	return b.
		For(&v1alpha1.Tunnel{}).
		Watches(&v1alpha1.Tunnel{}, self, selfUrgent).
		Owns(&corev1.Service{}).
		Watches(&v1alpha1.Chain{}, urgentWhen(enqueueReferrers(mgr.GetClient(), &v1alpha1.TunnelList{}, indexTunnelChain), specOrMembers),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return specMembersOrReady(e.ObjectOld, e.ObjectNew)
			}})).
		WithOptions(controller.Options{MaxConcurrentReconciles: tunnelWorkers}).
		// A RelayNode's spec.tun decides whether tun Tunnels through it
		// can work, and its spec.sidecar where Tunnels listen: the
		// Tunnels of the Chains it enters or ends look again when its
		// spec changes (its status changes often, and counts for none).
		Watches(&v1alpha1.RelayNode{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return tunnelsAt(ctx, mgr.GetClient(), o.GetNamespace(), o.GetName(), true)
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// tunnelsAt lists the Tunnels of the Chains that enter at a relay (and,
// with ends, that exit at it too).
func tunnelsAt(ctx context.Context, c client.Reader, ns, relay string, ends bool) []reconcile.Request {
	var chains v1alpha1.ChainList
	if err := c.List(ctx, &chains, client.InNamespace(ns), client.MatchingFields{indexChainRelays: relay}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list Chains of a RelayNode")
		return nil
	}
	var reqs []reconcile.Request
	for _, ch := range chains.Items {
		if ch.Spec.Entry != relay && (!ends || ch.Spec.Exit != relay) {
			continue
		}
		var tunnels v1alpha1.TunnelList
		if err := c.List(ctx, &tunnels, client.InNamespace(ns), client.MatchingFields{indexTunnelChain: ch.Name}, client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "list Tunnels of a Chain")
			return nil
		}
		for _, t := range tunnels.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&t)})
		}
	}
	return reqs
}
