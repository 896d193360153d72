package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
)

// ServiceImportReconciler keeps, for each service of the clusterset, its
// ServiceImport in this cluster (in the namespace of the same name), the
// Service that holds its clusterset IPs, and its EndpointSlices: this
// cluster's own endpoints where it exports the service, else its gateway
// relays at the listen ports of the Tunnels to the nearest cluster that
// does.
type ServiceImportReconciler struct {
	client.Client
	Set *clusterSet
}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

func (r *ServiceImportReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := req.String()
	s := r.Set.Service(key)
	var ns corev1.Namespace
	err := r.Get(ctx, types.NamespacedName{Name: req.Namespace}, &ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	nsGone := err != nil || ns.DeletionTimestamp != nil
	// Only a service that exists can be missing here.
	r.Set.SetMissing(key, s != nil && nsGone)
	if nsGone {
		return ctrl.Result{}, nil
	}
	var si mcsv1beta1.ServiceImport
	err = r.Get(ctx, req.NamespacedName, &si)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	case err == nil && si.Labels[clusterset.LabelManaged] != "true":
		// Another implementation's, or a user's: not ours to change.
		return ctrl.Result{}, nil
	case s == nil:
		if !r.Set.Synced() {
			// Its exports may only be in a report not read yet.
			return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
		}
		if err == nil {
			return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, &si))
		}
		return ctrl.Result{}, r.deleteSlices(ctx, req.Namespace, req.Name, nil)
	}
	if apierrors.IsNotFound(err) {
		si = *clusterset.ServiceImport(s, nil, nil)
		si.Status = mcsv1beta1.ServiceImportStatus{}
		if err := r.Create(ctx, &si); err != nil {
			return ctrl.Result{}, err
		}
	}
	var ips []string
	var families []corev1.IPFamily
	ready := metav1.Condition{Type: string(mcsv1beta1.ServiceImportConditionReady), Status: metav1.ConditionTrue,
		Reason: string(mcsv1beta1.ServiceImportReasonReady), Message: "headless: DNS answers with the exporting clusters' endpoints"}
	if want := clusterset.DerivedService(s); want != nil {
		got, cond, err := r.derived(ctx, &si, want)
		if err != nil {
			return ctrl.Result{}, err
		}
		ready = cond
		if got != nil {
			ips, families = got.Spec.ClusterIPs, got.Spec.IPFamilies
		}
	}
	want := clusterset.ServiceImport(s, ips, families)
	meta.SetStatusCondition(&want.Status.Conditions, ready)
	if err := r.updateImport(ctx, &si, want); err != nil {
		return ctrl.Result{}, err
	}
	src, err := r.sources(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.slices(ctx, &si, clusterset.EndpointSlices(s, src))
}

// derived keeps the Service of a ClusterSetIP import, owned by the import;
// the condition says whether its IPs are the import's.
func (r *ServiceImportReconciler) derived(ctx context.Context, si *mcsv1beta1.ServiceImport, want *corev1.Service) (*corev1.Service, metav1.Condition, error) {
	cond := metav1.Condition{Type: string(mcsv1beta1.ServiceImportConditionReady)}
	if err := controllerutil.SetControllerReference(si, want, r.Scheme()); err != nil {
		return nil, cond, err
	}
	var got corev1.Service
	err := r.Get(ctx, client.ObjectKeyFromObject(want), &got)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Create(ctx, want); err != nil {
			return nil, cond, err
		}
		got = *want
	case err != nil:
		return nil, cond, err
	case !metav1.IsControlledBy(&got, si):
		cond.Status, cond.Reason = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonPending)
		cond.Message = fmt.Sprintf("Service %q, which would hold the clusterset IPs, exists and is not this import's: rename or delete it", want.Name)
		return nil, cond, nil
	default:
		next := got.DeepCopy()
		next.Labels = want.Labels
		next.Spec.Ports, next.Spec.SessionAffinity, next.Spec.SessionAffinityConfig = want.Spec.Ports, want.Spec.SessionAffinity, want.Spec.SessionAffinityConfig
		if len(next.Spec.Ports) == 0 {
			// A Service needs a port; an import of SCTP ports alone keeps
			// the ones it had.
			next.Spec.Ports = got.Spec.Ports
		}
		if !equality.Semantic.DeepEqual(&got, next) {
			if err := r.Update(ctx, next); err != nil {
				return nil, cond, err
			}
			got = *next
		}
	}
	if len(got.Spec.ClusterIPs) == 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonPending), "waiting for the cluster to give the clusterset IPs"
		return &got, cond, nil
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, string(mcsv1beta1.ServiceImportReasonReady)
	cond.Message = fmt.Sprintf("clusterset IPs %s (Service %s) reach the exporting clusters through the relays", strings.Join(got.Spec.ClusterIPs, ", "), got.Name)
	return &got, cond, nil
}

// updateImport writes the import's spec, labels, annotations and status
// where they differ from what is wanted.
func (r *ServiceImportReconciler) updateImport(ctx context.Context, si, want *mcsv1beta1.ServiceImport) error {
	if !equality.Semantic.DeepEqual(si.Spec, want.Spec) || !equality.Semantic.DeepEqual(si.Labels, want.Labels) ||
		!equality.Semantic.DeepEqual(nilIfEmpty(si.Annotations), nilIfEmpty(want.Annotations)) {
		next := si.DeepCopy()
		next.Spec, next.Labels, next.Annotations = want.Spec, want.Labels, want.Annotations
		if err := r.Update(ctx, next); err != nil {
			return err
		}
		*si = *next
	}
	status := want.Status.DeepCopy()
	for i := range status.Conditions {
		if old := meta.FindStatusCondition(si.Status.Conditions, status.Conditions[i].Type); old != nil && old.Status == status.Conditions[i].Status {
			status.Conditions[i].LastTransitionTime = old.LastTransitionTime
		} else {
			status.Conditions[i].LastTransitionTime = metav1.Now()
		}
	}
	return patchStatus(ctx, r.Client, si, &si.Status, status)
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

// sources are what this cluster has to reach the service: its gateway
// relays, the Tunnels the exporters hold, its own endpoints, which clusters
// are down and how far the others are.
func (r *ServiceImportReconciler) sources(ctx context.Context, s *clusterset.Service) (clusterset.Sources, error) {
	src := clusterset.Sources{Self: r.Set.self, Listen: r.Set.Listen(), Down: r.Set.Down(), Cost: map[string]time.Duration{}}
	if s.Spec.Type != mcsv1beta1.ClusterSetIP {
		return src, nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(r.Set.ns), client.MatchingLabels{LabelRelayNode: r.Set.o.Gateway.Name}); err != nil {
		return src, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		// An entry per address: a dual-stack gateway pod stands in the
		// import's slice of each family.
		for _, ip := range podIPs(&p) {
			src.Gateway = append(src.Gateway, clusterset.GatewayPod{Address: ip, Ready: podReady(&p), NodeName: p.Spec.NodeName})
		}
	}
	if s.Export(r.Set.self) != nil {
		var l discoveryv1.EndpointSliceList
		if err := r.List(ctx, &l, client.InNamespace(s.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: s.Name}); err != nil {
			return src, err
		}
		src.Local = l.Items
	}
	for _, c := range s.Exporters {
		if c == r.Set.self {
			continue
		}
		var ch v1alpha1.Chain
		if err := r.Get(ctx, types.NamespacedName{Namespace: r.Set.ns, Name: clusterset.ChainName(r.Set.self, c)}, &ch); err != nil {
			continue
		}
		if lat := ch.Status.Latency; len(ch.Status.Route) > 0 && lat != nil {
			switch {
			case lat.Measured != nil:
				src.Cost[c] = lat.Measured.Duration
			case lat.Estimated != nil:
				src.Cost[c] = lat.Estimated.Duration
			}
		}
		if cond := meta.FindStatusCondition(ch.Status.Conditions, conditionReady); cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonNoRoute {
			src.Down[c] = true
		}
	}
	return src, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// slices makes the import's EndpointSlices what is wanted.
func (r *ServiceImportReconciler) slices(ctx context.Context, si *mcsv1beta1.ServiceImport, want []discoveryv1.EndpointSlice) error {
	keep := map[string]bool{}
	for i := range want {
		w := &want[i]
		keep[w.Name] = true
		if err := controllerutil.SetControllerReference(si, w, r.Scheme()); err != nil {
			return err
		}
		var got discoveryv1.EndpointSlice
		err := r.Get(ctx, client.ObjectKeyFromObject(w), &got)
		switch {
		case apierrors.IsNotFound(err):
			if err := r.Create(ctx, w); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		case err != nil:
			return err
		case got.AddressType != w.AddressType:
			// Immutable: made again.
			if err := r.Delete(ctx, &got); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return fmt.Errorf("EndpointSlice %s changed its address type: made again", w.Name)
		default:
			if !equality.Semantic.DeepEqual(got.Labels, w.Labels) || !equality.Semantic.DeepEqual(got.Endpoints, w.Endpoints) ||
				!equality.Semantic.DeepEqual(got.Ports, w.Ports) || !equality.Semantic.DeepEqual(got.OwnerReferences, w.OwnerReferences) {
				next := got.DeepCopy()
				next.Labels, next.Endpoints, next.Ports, next.OwnerReferences = w.Labels, w.Endpoints, w.Ports, w.OwnerReferences
				if err := r.Update(ctx, next); err != nil {
					return err
				}
			}
		}
	}
	return r.deleteSlices(ctx, si.Namespace, si.Name, keep)
}

// deleteSlices deletes the import's EndpointSlices but those in keep.
func (r *ServiceImportReconciler) deleteSlices(ctx context.Context, ns, name string, keep map[string]bool) error {
	var l discoveryv1.EndpointSliceList
	if err := r.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{clusterset.LabelManaged: "true", mcsv1beta1.LabelServiceName: name}); err != nil {
		return err
	}
	for i := range l.Items {
		if !keep[l.Items[i].Name] {
			if err := r.Delete(ctx, &l.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

func (r *ServiceImportReconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		var out []reconcile.Request
		for _, s := range r.Set.Services() {
			out = append(out, request(s.Key()))
		}
		return out
	})
	inNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var out []reconcile.Request
		for _, s := range r.Set.Services() {
			if s.Namespace == o.GetName() {
				out = append(out, request(s.Key()))
			}
		}
		return out
	})
	gateway := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Set.ns && o.GetLabels()[LabelRelayNode] == r.Set.o.Gateway.Name
	})
	managed := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Set.ns && o.GetLabels()[clusterset.LabelManaged] == "true"
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("serviceimport").
		For(&mcsv1beta1.ServiceImport{}).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}).
		// The exported Service's own endpoints, which this cluster's
		// clients reach directly.
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name := o.GetLabels()[discoveryv1.LabelServiceName]
			if name == "" || o.GetLabels()[clusterset.LabelManaged] != "" || r.Set.Service(o.GetNamespace()+"/"+name) == nil {
				return nil
			}
			return []reconcile.Request{request(o.GetNamespace() + "/" + name)}
		})).
		Watches(&corev1.Pod{}, all, builder.WithPredicates(gateway)).
		Watches(&v1alpha1.Chain{}, all, builder.WithPredicates(managed)).
		Watches(&corev1.Namespace{}, inNamespace).
		WatchesRawSource(r.Set.imports).
		Complete(r)
}
