package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/clusterset"
)

// ServiceExportReconciler turns a ServiceExport and its Service into this
// cluster's export in the clusterset report, and says in the export's
// conditions whether it is valid, exported, and in conflict with another
// cluster's export of the same service (KEP 1645: Valid, Ready, Conflict).
type ServiceExportReconciler struct {
	client.Client
	Set *clusterSet
}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports/status,verbs=get;update;patch

func (r *ServiceExportReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := req.String()
	var se mcsv1beta1.ServiceExport
	if err := r.Get(ctx, req.NamespacedName, &se); err != nil {
		if apierrors.IsNotFound(err) {
			r.Set.SetExport(key, nil)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if se.DeletionTimestamp != nil {
		r.Set.SetExport(key, nil)
		return ctrl.Result{}, nil
	}
	var svc corev1.Service
	err := r.Get(ctx, req.NamespacedName, &svc)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	var eps []discoveryv1.EndpointSlice
	if err == nil && svc.Spec.ClusterIP == corev1.ClusterIPNone {
		var l discoveryv1.EndpointSliceList
		if err := r.List(ctx, &l, client.InNamespace(req.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: req.Name}); err != nil {
			return ctrl.Result{}, err
		}
		eps = l.Items
	}
	var found *corev1.Service
	if err == nil {
		found = &svc
	}
	export, valid := ExportOf(&se, found, eps)
	r.Set.SetExport(key, export)

	status := se.Status.DeepCopy()
	valid.ObservedGeneration = se.Generation
	meta.SetStatusCondition(&status.Conditions, valid)
	for _, c := range r.exported(&se, export) {
		c.ObservedGeneration = se.Generation
		meta.SetStatusCondition(&status.Conditions, c)
	}
	if export == nil {
		meta.RemoveStatusCondition(&status.Conditions, string(mcsv1beta1.ServiceExportConditionConflict))
	}
	return ctrl.Result{}, patchStatus(ctx, r.Client, &se, &se.Status, status)
}

// exported are the Ready and Conflict conditions of a valid export (only
// Ready, False, of an invalid one).
func (r *ServiceExportReconciler) exported(se *mcsv1beta1.ServiceExport, export *clusterset.Export) []metav1.Condition {
	ready := func(status metav1.ConditionStatus, reason mcsv1beta1.ServiceExportConditionReason, msg string) metav1.Condition {
		return metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionReady), Status: status, Reason: string(reason), Message: msg}
	}
	if export == nil {
		return []metav1.Condition{ready(metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonFailed, "not exported: the export is not valid (see the Valid condition)")}
	}
	key := export.Key()
	s := r.Set.Service(key)
	if !r.Set.Published(key) || s == nil {
		return []metav1.Condition{ready(metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonPending,
			"being written into the report the relays serve to the clusterset's other clusters")}
	}
	var importers []string
	for _, rep := range r.Set.Reports() {
		if !slices.Contains(s.Lacking, rep.Cluster) {
			importers = append(importers, rep.Cluster)
		}
	}
	msg := fmt.Sprintf("exported to the clusterset: imported in %s", strings.Join(importers, ", "))
	if len(s.Lacking) > 0 {
		msg += fmt.Sprintf("; not in %s, which have no namespace %q: create it there to import the service", strings.Join(s.Lacking, ", "), se.Namespace)
	}
	if dropped := droppedPorts(s, r.Set.self); len(dropped) > 0 {
		msg += "; " + dropped
	}
	conds := []metav1.Condition{ready(metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonExported, msg)}
	conflict := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), Status: metav1.ConditionFalse,
		Reason: string(mcsv1beta1.ServiceExportReasonNoConflicts), Message: "every cluster's export of the service agrees"}
	if len(s.Conflicts) > 0 {
		conflict.Status, conflict.Reason, conflict.Message = metav1.ConditionTrue, s.ConflictReason(), s.ConflictMessage
	}
	return append(conds, conflict)
}

// droppedPorts says which of this cluster's ports no cluster reaches here:
// another export took their name, or relays do not carry their protocol.
func droppedPorts(s *clusterset.Service, self string) string {
	e := s.Export(self)
	var lost, sctp []string
	for _, p := range e.Ports {
		served := false
		for i, q := range s.Spec.Ports {
			if q.Name == p.Name && q.Protocol == p.Protocol && q.Port == p.Port && slices.Contains(s.Serving[i], self) {
				served = true
			}
		}
		switch {
		case !served:
			lost = append(lost, fmt.Sprintf("%s %s/%d", p.Name, p.Protocol, p.Port))
		case !clusterset.Carried(p.Protocol):
			sctp = append(sctp, fmt.Sprintf("%s %s/%d", p.Name, p.Protocol, p.Port))
		}
	}
	var parts []string
	if len(lost) > 0 {
		parts = append(parts, fmt.Sprintf("ports %s get no traffic from other clusters: an older export of the service has them otherwise (rename them, or make them alike)", strings.Join(lost, ", ")))
	}
	if len(sctp) > 0 {
		parts = append(parts, fmt.Sprintf("ports %s are imported but not carried: relays carry TCP and UDP", strings.Join(sctp, ", ")))
	}
	return strings.Join(parts, "; ")
}

// ExportOf is this cluster's export of a Service, and the Valid condition:
// an export of a missing Service, or of an ExternalName one, is not valid
// (nil), and the condition says what to do.
func ExportOf(se *mcsv1beta1.ServiceExport, svc *corev1.Service, eps []discoveryv1.EndpointSlice) (*clusterset.Export, metav1.Condition) {
	valid := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionValid), Status: metav1.ConditionTrue,
		Reason: string(mcsv1beta1.ServiceExportReasonValid), Message: "the Service exists and may be exported"}
	invalid := func(reason mcsv1beta1.ServiceExportConditionReason, format string, args ...any) (*clusterset.Export, metav1.Condition) {
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, string(reason), fmt.Sprintf(format, args...)
		return nil, valid
	}
	switch {
	case svc == nil:
		return invalid(mcsv1beta1.ServiceExportReasonNoService,
			"there is no Service %q in namespace %q: create it (a ServiceExport exports the Service of its own name and namespace), or delete this ServiceExport", se.Name, se.Namespace)
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return invalid(mcsv1beta1.ServiceExportReasonInvalidServiceType,
			"Service %q is of type ExternalName, which the Multi-Cluster Services API does not export: export a Service with a cluster IP, or a headless one", se.Name)
	case svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0:
		return invalid(mcsv1beta1.ServiceExportReasonInvalidServiceType, "Service %q has no cluster IP yet", se.Name)
	}
	e := &clusterset.Export{Namespace: se.Namespace, Name: se.Name, Created: se.CreationTimestamp, Type: mcsv1beta1.ClusterSetIP,
		SessionAffinity: svc.Spec.SessionAffinity, SessionAffinityConfig: svc.Spec.SessionAffinityConfig.DeepCopy(),
		IPFamilies: slices.Clone(svc.Spec.IPFamilies), InternalTrafficPolicy: svc.Spec.InternalTrafficPolicy, TrafficDistribution: svc.Spec.TrafficDistribution,
		Labels: se.Spec.ExportedLabels, Annotations: se.Spec.ExportedAnnotations, Address: svc.Spec.ClusterIP}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		e.Type, e.Address = mcsv1beta1.Headless, ""
		e.Endpoints = headlessEndpoints(eps)
	}
	for _, p := range svc.Spec.Ports {
		e.Ports = append(e.Ports, mcsv1beta1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, AppProtocol: p.AppProtocol})
	}
	if err := e.Check(); err != nil {
		return invalid(mcsv1beta1.ServiceExportReasonInvalidServiceType, "the Service cannot be exported as it is: %v", err)
	}
	return e, valid
}

// headlessEndpoints are a headless Service's endpoints as its EndpointSlices
// list them, for the other clusters' DNS.
func headlessEndpoints(eps []discoveryv1.EndpointSlice) []clusterset.Endpoints {
	var out []clusterset.Endpoints
	n := 0
	for _, sl := range eps {
		i := slices.IndexFunc(out, func(e clusterset.Endpoints) bool { return e.AddressType == sl.AddressType })
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		if i < 0 {
			out = append(out, clusterset.Endpoints{AddressType: sl.AddressType})
			i = len(out) - 1
		}
		for _, p := range sl.Ports {
			if !slices.ContainsFunc(out[i].Ports, func(q discoveryv1.EndpointPort) bool {
				return ptr.Deref(q.Name, "") == ptr.Deref(p.Name, "")
			}) {
				out[i].Ports = append(out[i].Ports, *p.DeepCopy())
			}
		}
		for _, ep := range sl.Endpoints {
			if n >= clusterset.MaxEndpoints {
				break
			}
			n++
			out[i].Endpoints = append(out[i].Endpoints, clusterset.Endpoint{Addresses: slices.Clone(ep.Addresses),
				Hostname: ptr.Deref(ep.Hostname, ""), Ready: ptr.Deref(ep.Conditions.Ready, true)})
		}
	}
	// The same endpoints make the same report, whatever the slices' order.
	for i := range out {
		slices.SortFunc(out[i].Endpoints, func(a, b clusterset.Endpoint) int {
			return strings.Compare(strings.Join(a.Addresses, ","), strings.Join(b.Addresses, ","))
		})
	}
	return out
}

func (r *ServiceExportReconciler) SetupWithManager(mgr ctrl.Manager) error {
	same := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("serviceexport").
		For(&mcsv1beta1.ServiceExport{}).
		// The Service of the same name, and a headless one's endpoints.
		Watches(&corev1.Service{}, same).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name := o.GetLabels()[discoveryv1.LabelServiceName]
			if name == "" || o.GetLabels()[clusterset.LabelManaged] != "" {
				return nil
			}
			return []reconcile.Request{request(o.GetNamespace() + "/" + name)}
		})).
		WatchesRawSource(r.Set.exportC).
		Complete(r)
}
