package inject

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// WebhookConfiguration is the injection webhook's registration, as the
// chart installs it (a chart test compares the two): pods only, on create,
// only those carrying the RelayNode label and not run by the operator,
// never in kube-system or the operator's namespace. Failing closed costs
// only the pods that asked for a sidecar, which must not start without it.
func WebhookConfiguration(name, namespace, service string) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "sidecar.hoplink.dev",
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: namespace, Name: service, Path: ptr.To(Path), Port: ptr.To[int32](443)}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
					Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}},
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: v1alpha1.LabelRelayNode, Operator: metav1.LabelSelectorOpExists},
				{Key: labelManagedBy, Operator: metav1.LabelSelectorOpNotIn, Values: []string{ManagedByOperator}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", namespace}},
			}},
			FailurePolicy:      ptr.To(admissionregistrationv1.Fail),
			SideEffects:        ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:     ptr.To[int32](5),
			ReinvocationPolicy: ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			MatchPolicy:        ptr.To(admissionregistrationv1.Equivalent),
		}},
	}
}
