package controllers

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// PodCertificateSigner is the signer hoplink.dev/relay: it issues each
// sidecar relay's pod a certificate of its own (the kubelet asks for it
// through the podCertificate projected volume the webhook adds) naming the
// RelayNode the pod's label names, if that RelayNode is of the pod's
// namespace, in sidecar mode, and holds its name across namespaces.
// The key never leaves the node: the request carries only the public key.
type PodCertificateSigner struct {
	client.Client
	// Reader reads pods and RelayNodes from the API server: the cache
	// holds only labelled pods (an unlabelled pod's request must be
	// denied, not left waiting), and a name is lent on what is stored now,
	// not on what the cache has seen so far.
	Reader client.Reader
	CA     *pki.CA
	// Policy, when set, refuses pods of RelayNodes the relay policy
	// refuses: pods injected before it did get no new certificate, so
	// their relays stop within a day.
	Policy *RelayPolicy
}

// podCertLifetime is the longest certificate the signer issues; the kubelet
// renews at BeginRefreshAt, two thirds in.
const podCertLifetime = 24 * time.Hour

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=podcertificaterequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=podcertificaterequests/status,verbs=update;patch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=sign,resourceNames=hoplink.dev/relay

func (r *PodCertificateSigner) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pcr certificatesv1.PodCertificateRequest
	if err := r.Get(ctx, req.NamespacedName, &pcr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pcr.Spec.SignerName != inject.SignerName || decided(&pcr) {
		return ctrl.Result{}, nil
	}
	relay, denial, err := r.check(ctx, &pcr)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := metav1.Now()
	if denial != nil {
		meta.SetStatusCondition(&pcr.Status.Conditions, metav1.Condition{Type: certificatesv1.PodCertificateRequestConditionTypeDenied,
			Status: metav1.ConditionTrue, Reason: denial.reason, Message: denial.message, LastTransitionTime: now})
		return ctrl.Result{}, r.Status().Update(ctx, &pcr)
	}
	csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
	if err != nil {
		meta.SetStatusCondition(&pcr.Status.Conditions, metav1.Condition{Type: certificatesv1.PodCertificateRequestConditionTypeDenied,
			Status: metav1.ConditionTrue, Reason: certificatesv1.PodCertificateRequestConditionUnsupportedKeyType,
			Message: fmt.Sprintf("unreadable request: %v; use keyType ECDSAP256", err), LastTransitionTime: now})
		return ctrl.Result{}, r.Status().Update(ctx, &pcr)
	}
	lifetime := podCertLifetime
	if m := pcr.Spec.MaxExpirationSeconds; m != nil && time.Duration(*m)*time.Second < lifetime {
		lifetime = time.Duration(*m) * time.Second
	}
	certPEM, notBefore, notAfter, err := r.CA.IssueFor(csr.PublicKey, pcr.Namespace, relay, lifetime)
	if err != nil {
		meta.SetStatusCondition(&pcr.Status.Conditions, metav1.Condition{Type: certificatesv1.PodCertificateRequestConditionTypeFailed,
			Status: metav1.ConditionTrue, Reason: ReasonIssueFailed, Message: err.Error(), LastTransitionTime: now})
		return ctrl.Result{}, r.Status().Update(ctx, &pcr)
	}
	pcr.Status.CertificateChain = string(certPEM)
	pcr.Status.NotBefore = &metav1.Time{Time: notBefore}
	pcr.Status.NotAfter = &metav1.Time{Time: notAfter}
	pcr.Status.BeginRefreshAt = &metav1.Time{Time: notBefore.Add(lifetime * 2 / 3)}
	meta.SetStatusCondition(&pcr.Status.Conditions, metav1.Condition{Type: certificatesv1.PodCertificateRequestConditionTypeIssued,
		Status: metav1.ConditionTrue, Reason: ReasonIssued, Message: fmt.Sprintf("certificate for relay %q", relay), LastTransitionTime: now})
	return ctrl.Result{}, r.Status().Update(ctx, &pcr)
}

// check returns the relay a request may get a certificate for, or why not:
// the relay a pod may be is the RelayNode its label names in its own
// namespace, in sidecar mode, holding its name (as the RelayNode
// reconciler decides it, relayNameHolder); a relay's peers know it by that
// name alone.
func (r *PodCertificateSigner) check(ctx context.Context, pcr *certificatesv1.PodCertificateRequest) (string, *refusal, error) {
	deny := func(format string, args ...any) (string, *refusal, error) {
		return "", &refusal{ReasonNotASidecarRelay, fmt.Sprintf(format, args...)}, nil
	}
	var pod corev1.Pod
	switch err := r.Reader.Get(ctx, types.NamespacedName{Namespace: pcr.Namespace, Name: pcr.Spec.PodName}, &pod); {
	case apierrors.IsNotFound(err):
		return deny("pod %s/%s does not exist", pcr.Namespace, pcr.Spec.PodName)
	case err != nil:
		return "", nil, err
	}
	if pod.UID != pcr.Spec.PodUID {
		return deny("pod %s/%s is not the pod that asked (UID %s)", pcr.Namespace, pod.Name, pcr.Spec.PodUID)
	}
	relay := pod.Labels[v1alpha1.LabelRelayNode]
	if relay == "" {
		return deny("pod %s/%s is no sidecar relay's (it has no %s label): label its workload with the name of a sidecar RelayNode of namespace %s",
			pod.Namespace, pod.Name, v1alpha1.LabelRelayNode, pod.Namespace)
	}
	if pod.Labels[labelManagedBy] == managerName {
		return deny("pod %s/%s carries %s=%s, the mark of the operator's own relay pods, which read their certificate from a Secret: remove that label from a workload's pods",
			pod.Namespace, pod.Name, labelManagedBy, managerName)
	}
	var rn v1alpha1.RelayNode
	switch err := r.Reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: relay}, &rn); {
	case apierrors.IsNotFound(err):
		return deny("pod %s/%s is labelled %s=%s, but there is no RelayNode %q in namespace %s, and a pod may be only its own namespace's relay: create RelayNode %q with spec.sidecar: {} there, or remove the label",
			pod.Namespace, pod.Name, v1alpha1.LabelRelayNode, relay, relay, pod.Namespace, relay)
	case err != nil:
		return "", nil, err
	}
	if !rn.Spec.IsSidecar() {
		return deny("RelayNode %s/%s is not in sidecar mode (its relays run as a DaemonSet or outside the cluster, with the certificate of its Secret): set spec.sidecar: {} on it, or remove the label %s from pod %s",
			rn.Namespace, rn.Name, v1alpha1.LabelRelayNode, pod.Name)
	}
	switch holder, err := relayNameHolder(ctx, r.Reader, &rn); {
	case err != nil:
		return "", nil, err
	case holder != "":
		return "", &refusal{ReasonNameConflict, fmt.Sprintf("RelayNode %s/%s does not hold its name: RelayNode %q of namespace %q was created before it (or in the same second), and a relay's name is its certificate name; rename this one (and its pods' label %s)",
			rn.Namespace, rn.Name, rn.Name, holder, v1alpha1.LabelRelayNode)}, nil
	}
	if r.Policy != nil {
		switch reason, message, err := r.Policy.Refusal(ctx, r.Reader, &rn); {
		case err != nil:
			return "", nil, err
		case reason != "":
			return "", &refusal{reason, fmt.Sprintf("RelayNode %s/%s may not run here: %s", rn.Namespace, rn.Name, message)}, nil
		}
	}
	return relay, nil, nil
}

// decided: the signer (or another) has answered the request already.
func decided(pcr *certificatesv1.PodCertificateRequest) bool {
	for _, t := range []string{certificatesv1.PodCertificateRequestConditionTypeIssued,
		certificatesv1.PodCertificateRequestConditionTypeDenied, certificatesv1.PodCertificateRequestConditionTypeFailed} {
		if meta.IsStatusConditionTrue(pcr.Status.Conditions, t) {
			return true
		}
	}
	return false
}

// SetupWithManager registers the signer for this signer's requests only.
func (r *PodCertificateSigner) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&certificatesv1.PodCertificateRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*certificatesv1.PodCertificateRequest).Spec.SignerName == inject.SignerName
		}))).
		Complete(r)
}
