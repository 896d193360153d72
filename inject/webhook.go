package inject

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Path is where the operator serves the injection webhook.
const Path = "/inject-v1-pod"

// ManagedByOperator is the label value of the pods the operator itself
// runs (relay DaemonSets): they carry the RelayNode label too, and are
// never injected.
const (
	labelManagedBy     = "app.kubernetes.io/managed-by"
	ManagedByOperator  = "hoplink-operator"
	labelEnforce       = "pod-security.kubernetes.io/enforce"
	restrictedSecurity = "restricted"
)

// Webhook injects sidecar relays into the pods that ask for one.
type Webhook struct {
	// Reader reads RelayNodes and Namespaces: the operator's cache, so
	// that no review, asked for by anyone who reaches the port, costs a
	// request to the API server or waits on the operator's rate limit.
	Reader client.Reader
	// Settle is how long a RelayNode the Reader does not have yet is
	// waited for (one created just before its pods, not yet in the
	// cache); 0: not waited for. At most maxSettling reviews wait at once:
	// the others are answered at once.
	Settle time.Duration
	// NameHolder returns the namespace of a RelayNode that keeps rn from
	// holding its name, "" when rn holds it: the operator's NameConflict
	// rule, whose losers' relays get no certificate. Nil: not asked.
	NameHolder func(ctx context.Context, rn *v1alpha1.RelayNode) (string, error)
	// Policy says why the operator's relay policy refuses rn (its image, a
	// TUN device in a namespace not allowed privileged relays): the
	// reason and message of its Ready condition, "" when it may run. Nil:
	// not asked.
	Policy func(ctx context.Context, rn *v1alpha1.RelayNode) (reason, message string, err error)
	Config Config

	settling atomic.Int32
}

// maxSettling bounds the reviews that wait for a RelayNode at once.
const maxSettling = 64

// getRelayNode reads a RelayNode, waiting up to Settle for one the cache
// has not seen yet.
func (w *Webhook) getRelayNode(ctx context.Context, key types.NamespacedName, rn *v1alpha1.RelayNode) error {
	err := w.Reader.Get(ctx, key, rn)
	if !apierrors.IsNotFound(err) || w.Settle <= 0 {
		return err
	}
	if w.settling.Add(1) > maxSettling {
		w.settling.Add(-1)
		return err
	}
	defer w.settling.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, w.Settle)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return err
		case <-t.C:
		}
		if err = w.Reader.Get(ctx, key, rn); !apierrors.IsNotFound(err) {
			return err
		}
	}
}

var _ admission.Handler = (*Webhook)(nil)

// Handle answers one admission request: a patch that adds the sidecar, an
// empty answer for pods that need none, or a denial that names the fix.
func (w *Webhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" {
		return admission.Allowed("")
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode pod: %w", err))
	}
	name := pod.Labels[v1alpha1.LabelRelayNode]
	if name == "" || pod.Labels[labelManagedBy] == ManagedByOperator {
		return admission.Allowed("no sidecar asked for")
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if pod.Spec.HostNetwork {
		return admission.Denied(fmt.Sprintf("pod label %s=%s asks for a sidecar relay, which needs the pod's own network: remove spec.hostNetwork, or the label",
			v1alpha1.LabelRelayNode, name))
	}
	var rn v1alpha1.RelayNode
	switch err := w.getRelayNode(ctx, types.NamespacedName{Namespace: ns, Name: name}, &rn); {
	case apierrors.IsNotFound(err):
		return admission.Denied(fmt.Sprintf("pod label %s=%s names no RelayNode in namespace %s: create RelayNode %q with spec.sidecar: {}, or remove the label",
			v1alpha1.LabelRelayNode, name, ns, name))
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("read RelayNode %s/%s: %w", ns, name, err))
	}
	if !rn.Spec.IsSidecar() {
		return admission.Denied(fmt.Sprintf("RelayNode %s/%s is not in sidecar mode (its relays run as a DaemonSet): set spec.sidecar: {} on it, or remove the label %s from this pod",
			ns, name, v1alpha1.LabelRelayNode))
	}
	if w.NameHolder != nil {
		// The pod could not start: it would wait for a certificate the
		// signer denies, and a Secret that does not exist.
		switch holder, err := w.NameHolder(ctx, &rn); {
		case err != nil:
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("RelayNode %s/%s: %w", ns, name, err))
		case holder != "":
			return admission.Denied(fmt.Sprintf("RelayNode %s/%s does not hold its name: RelayNode %q of namespace %q was created before it, or in the same second (NameConflict: a relay's name is its certificate name), so its relays get no certificate: rename it, and the label %s of this pod",
				ns, name, name, holder, v1alpha1.LabelRelayNode))
		}
	}
	if rn.Spec.TUN {
		var n corev1.Namespace
		if err := w.Reader.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("read Namespace %s: %w", ns, err))
		}
		if n.Labels[labelEnforce] == restrictedSecurity || n.Labels[labelEnforce] == "baseline" {
			return admission.Denied(fmt.Sprintf("RelayNode %s sets spec.tun: its sidecar needs NET_ADMIN, root and /dev/net/tun, which namespace %s forbids (%s=%s): run this workload in a namespace that allows privileged pods, or unset spec.tun",
				name, ns, labelEnforce, n.Labels[labelEnforce]))
		}
	}
	if w.Policy != nil {
		switch reason, message, err := w.Policy(ctx, &rn); {
		case err != nil:
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("RelayNode %s/%s: %w", ns, name, err))
		case reason != "":
			return admission.Denied(fmt.Sprintf("RelayNode %s/%s may not run here (%s): %s", ns, name, reason, message))
		}
	}
	ops, warnings := Patch(&pod, &rn, w.Config)
	if len(ops) == 0 {
		return admission.Allowed("injected already")
	}
	resp := admission.Patched("sidecar relay injected", ops...)
	resp.Warnings = warnings
	return resp
}
