package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
)

// ensureSidecarObjects keeps what a sidecar RelayNode needs besides its
// certificate: no DaemonSet; a headless Service whose EndpointSlices list
// the ready replicas (peers dial those), of both families where the
// cluster has them (a slice per family; manifest.Replicas joins a pod's
// addresses into one replica); and a Role bound to the service
// accounts of the labelled pods, so their sidecars may read the namespace's
// hoplink objects. The Service carries the RelayNode's member labels, which
// its EndpointSlices copy: relays watch the slices of their peers only.
func (r *RelayNodeReconciler) ensureSidecarObjects(ctx context.Context, rn *v1alpha1.RelayNode, pods []corev1.Pod, members []string) error {
	name := RelayObjectName(rn.Name)
	om := metav1.ObjectMeta{Name: name, Namespace: rn.Namespace}
	if err := r.deleteOwned(ctx, rn, &appsv1.DaemonSet{ObjectMeta: om}); err != nil {
		return err
	}
	own := func(o client.Object, mutate func()) error { return r.own(ctx, rn, o, mutate) }
	svc := &corev1.Service{ObjectMeta: om}
	if err := own(svc, func() {
		labels, _ := setMembers(svc.GetLabels(), joined(members))
		svc.SetLabels(labels)
		port := rn.Spec.RelayPort()
		svc.Spec.ClusterIP = corev1.ClusterIPNone
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
		svc.Spec.Selector = map[string]string{LabelRelayNode: rn.Name}
		svc.Spec.PublishNotReadyAddresses = false
		svc.Spec.Ports = []corev1.ServicePort{
			{Name: "quic", Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolUDP},
			{Name: "tls", Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP},
		}
	}); err != nil {
		return err
	}
	role := &rbacv1.Role{ObjectMeta: om}
	if err := own(role, func() { role.Rules = sidecarRules() }); err != nil {
		return err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: om}
	return own(rb, func() {
		rb.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		rb.Subjects = sidecarSubjects(pods)
	})
}

// sidecarSubjects are the distinct service accounts of the pods, sorted.
func sidecarSubjects(pods []corev1.Pod) []rbacv1.Subject {
	var out []rbacv1.Subject
	for _, p := range pods {
		sa := p.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		s := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: p.Namespace}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b rbacv1.Subject) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// sidecarPods are the namespace's pods labelled for this RelayNode, not
// the operator's own relay pods, not terminating, not finished (a Job's).
func (r *RelayNodeReconciler) sidecarPods(ctx context.Context, rn *v1alpha1.RelayNode) ([]corev1.Pod, error) {
	list, err := relayPods(ctx, r.Client, rn.Namespace, rn.Name)
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Labels[labelManagedBy] == managerName || !p.DeletionTimestamp.IsZero() ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// deleteSidecarObjects removes the Service of a RelayNode that left sidecar
// mode (its Role and RoleBinding are rewritten for the DaemonSet), and with
// rbac the Role and RoleBinding too (the policy refuses its sidecars).
func (r *RelayNodeReconciler) deleteSidecarObjects(ctx context.Context, rn *v1alpha1.RelayNode, rbac bool) error {
	om := metav1.ObjectMeta{Name: RelayObjectName(rn.Name), Namespace: rn.Namespace}
	objs := []client.Object{&corev1.Service{ObjectMeta: om}}
	if rbac {
		objs = append(objs, &rbacv1.RoleBinding{ObjectMeta: om}, &rbacv1.Role{ObjectMeta: om})
	}
	for _, o := range objs {
		if err := r.deleteOwned(ctx, rn, o); err != nil {
			return err
		}
	}
	return nil
}

// deleteOwned deletes o if it exists and is rn's, reading the cache first
// so that a reconcile with nothing to delete costs no API call.
func (r *RelayNodeReconciler) deleteOwned(ctx context.Context, rn *v1alpha1.RelayNode, o client.Object) error {
	if err := r.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(o, rn) {
		return nil
	}
	if err := r.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// sidecarStatus counts the labelled pods: injected, with a ready relay,
// and injected by another operator version.
func (r *RelayNodeReconciler) sidecarStatus(rn *v1alpha1.RelayNode, pods []corev1.Pod, status *v1alpha1.RelayNodeStatus) {
	status.Desired, status.Ready, status.Injected, status.Outdated = int32(len(pods)), 0, 0, 0
	status.Endpoints = nil // peers read the Service's EndpointSlices instead
	for _, p := range pods {
		v, injected := p.Annotations[inject.AnnotationVersion]
		if !injected {
			continue
		}
		status.Injected++
		if v != r.Version {
			status.Outdated++
		}
		for _, c := range p.Status.InitContainerStatuses {
			if c.Name == inject.ContainerName && c.Ready {
				status.Ready++
			}
		}
	}
	cond := metav1.Condition{Type: conditionReady, ObservedGeneration: rn.Generation}
	switch {
	case status.Ready > 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonSidecarsReady
		cond.Message = fmt.Sprintf("%d of %d labelled pods have a ready sidecar relay", status.Ready, status.Desired)
	case status.Desired == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoPods
		cond.Message = fmt.Sprintf("no pod in namespace %s carries the label %s=%s yet: add it to a workload's pod template", rn.Namespace, LabelRelayNode, rn.Name)
	case status.Injected < status.Desired:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNotInjected
		cond.Message = fmt.Sprintf("%d of %d labelled pods have no sidecar relay: they were created before the webhook answered; recreate them (kubectl rollout restart)", status.Desired-status.Injected, status.Desired)
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonSidecarsNotReady
		cond.Message = fmt.Sprintf("0 of %d sidecar relays ready: see `kubectl -n %s logs -l %s=%s -c %s`", status.Desired, rn.Namespace, LabelRelayNode, rn.Name, inject.ContainerName)
	}
	meta.SetStatusCondition(&status.Conditions, cond)
}
