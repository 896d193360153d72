package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// RelayNodeReconciler turns a RelayNode into a relay DaemonSet, the relay's
// certificate Secret, a ServiceAccount with read-only RBAC, and a status
// with the endpoints peers use.
type RelayNodeReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	CA     *pki.CA
	// Image runs relay pods unless a RelayNode names its own.
	Image string
	// RenewBefore renews a relay certificate this long before it expires
	// (default: a third of Validity).
	RenewBefore time.Duration
	// Validity of the relay certificates it writes into Secrets (default
	// pki.ClusterRelayValidity).
	Validity time.Duration
	// PodCertificates: the cluster serves PodCertificateRequests and the
	// signer issues sidecar relays' pods their certificates, so a sidecar
	// RelayNode's Secret holds the CA alone, never a key: a key in it
	// would be a copy of the relay's identity that outlives every pod.
	PodCertificates bool
	// Namespaces the operator is confined to (none: the cluster's); the
	// API server is asked for RelayNodes in these alone.
	Namespaces []string
	// Resources are relay containers' requests and limits unless a
	// RelayNode sets its own (nil: none).
	Resources *corev1.ResourceRequirements
	// Version of the operator: injected pods that carry another are outdated.
	Version string
	// BufferSysctls: relay pods in the pod network raise their TCP buffers'
	// ceiling (linkBufferSysctls); the cluster's kubelets accept it
	// (BufferSysctlsAllowed). Host-network relays share the node's.
	BufferSysctls bool
	// Policy says which images, and in which namespaces host network and
	// TUN devices, RelayNodes may ask for.
	Policy RelayPolicy
	// Reader reads namespaces (their labels opt in to privileged relays)
	// from the API server, without a cache of every namespace.
	Reader client.Reader
	// Reports are the relays' own word on what goes wrong.
	Reports *relayReports
	// Recorder tells a refusal as a Warning Event too (nil: conditions
	// only): `kubectl describe` and `kubectl get events` are where many
	// look first, and a condition is easy to miss there.
	Recorder recorder.EventRecorder
	// refusalsTold is the refusal last told as an Event, by RelayNode: the
	// status read from the cache may not show the last reconcile's yet, so
	// it cannot say whether an Event went out.
	refusalsTold sync.Map
}

// tellRefusal records a Warning Event for a refusal once, not at every
// recheck: a new reason, message or generation is a new refusal.
func (r *RelayNodeReconciler) tellRefusal(rn *v1alpha1.RelayNode, ref *refusal) {
	if r.Recorder == nil {
		return
	}
	key := types.NamespacedName{Namespace: rn.Namespace, Name: rn.Name}
	told := fmt.Sprintf("%d\x00%s\x00%s", rn.Generation, ref.reason, ref.message)
	if prev, ok := r.refusalsTold.Swap(key, told); ok && prev == told {
		return
	}
	r.Recorder.Eventf(rn, nil, corev1.EventTypeWarning, ref.reason, "Admit", "%s", ref.message)
}

// +kubebuilder:rbac:groups=hoplink.dev,resources=relaynodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=hoplink.dev,resources=relaynodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hoplink.dev,resources=chains;tunnels,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch

func (r *RelayNodeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rn v1alpha1.RelayNode
	if err := r.Get(ctx, req.NamespacedName, &rn); err != nil {
		if apierrors.IsNotFound(err) {
			r.refusalsTold.Delete(req.NamespacedName)
			forgetWrites(&v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}})
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !rn.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // owned objects go with it
	}
	// The relays of its Chains read it; first, since a Chain waits for
	// its relays' labels before it takes a new member's.
	members, err := relayMembers(ctx, r.Client, &rn)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := patchMembers(ctx, r.Client, &rn, joined(members)); err != nil {
		return ctrl.Result{}, err
	}
	status := rn.Status.DeepCopy()
	status.ObservedGeneration = rn.Generation

	nameConflict := func(other string) (ctrl.Result, error) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: conditionReady, Status: metav1.ConditionFalse, Reason: ReasonNameConflict, ObservedGeneration: rn.Generation,
			Message: fmt.Sprintf("RelayNode %q already exists in namespace %q (created before this one, or in the same second); a relay's name is its certificate name, so rename this one", rn.Name, other),
		})
		return ctrl.Result{}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
	}
	// From the cache here; ensureCertificate asks the API server again
	// before it issues a key.
	if other, err := relayNameHolder(ctx, r.Client, &rn); err != nil {
		return ctrl.Result{}, err
	} else if other != "" {
		return nameConflict(other)
	}

	var renewIn time.Duration
	if rn.Spec.IsSidecar() && r.PodCertificates {
		if err := r.ensureTrustOnly(ctx, &rn); err != nil {
			return ctrl.Result{}, err
		}
		status.CertificateNotAfter = podCertsNotAfter(rn.Status.CertificateNotAfter, time.Now())
		renewIn = time.Until(status.CertificateNotAfter.Add(-podCertLifetime * 2 / 3)) // when podCertsNotAfter moves it
	} else {
		notAfter, other, err := r.ensureCertificate(ctx, &rn)
		if err != nil {
			return ctrl.Result{}, err
		}
		if other != "" {
			return nameConflict(other)
		}
		status.CertificateNotAfter = &metav1.Time{Time: notAfter}
		renewIn = time.Until(notAfter.Add(-r.RenewBefore))
	}

	if rn.Spec.External {
		if err := r.deleteWorkload(ctx, &rn); err != nil {
			return ctrl.Result{}, err
		}
		status.Desired, status.Ready = 0, 0
		status.Endpoints = slices.Clone(rn.Spec.Endpoints)
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: conditionReady, Status: metav1.ConditionTrue, Reason: ReasonExternal, ObservedGeneration: rn.Generation,
			Message: fmt.Sprintf("runs outside this cluster; copy Secret %s to it, again after each renewal (its certificate holds for %s, renewed %s before status.certificateNotAfter); peers dial %v",
				RelayObjectName(rn.Name), days(r.validity()), days(r.RenewBefore), rn.Spec.Endpoints),
		})
		return ctrl.Result{RequeueAfter: renewIn}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
	}

	if rn.Spec.IsSidecar() {
		pods, err := r.sidecarPods(ctx, &rn)
		if err != nil {
			return ctrl.Result{}, err
		}
		if ref, err := r.refusal(ctx, &rn); err != nil {
			return ctrl.Result{}, err
		} else if ref != nil {
			// The webhook injects no new pod; those injected before lose
			// what their relays read and how peers find them.
			if err := r.deleteSidecarObjects(ctx, &rn, true); err != nil {
				return ctrl.Result{}, err
			}
			r.sidecarStatus(&rn, pods, status)
			r.tellRefusal(&rn, ref)
			meta.SetStatusCondition(&status.Conditions, metav1.Condition{
				Type: conditionReady, Status: metav1.ConditionFalse, Reason: ref.reason, ObservedGeneration: rn.Generation, Message: ref.message,
			})
			return ctrl.Result{RequeueAfter: min(renewIn, policyRecheck)}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
		}
		r.refusalsTold.Delete(req.NamespacedName)
		if err := r.ensureSidecarObjects(ctx, &rn, pods, members); err != nil {
			return ctrl.Result{}, err
		}
		r.sidecarStatus(&rn, pods, status)
		return ctrl.Result{RequeueAfter: renewIn}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
	}
	if err := r.deleteSidecarObjects(ctx, &rn, false); err != nil {
		return ctrl.Result{}, err
	}
	status.Injected, status.Outdated = 0, 0

	if ref, err := r.refusal(ctx, &rn); err != nil {
		return ctrl.Result{}, err
	} else if ref != nil {
		// Nothing runs that the policy does not allow, whatever ran before.
		if err := r.deleteWorkload(ctx, &rn); err != nil {
			return ctrl.Result{}, err
		}
		status.Desired, status.Ready, status.Endpoints = 0, 0, nil
		r.tellRefusal(&rn, ref)
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: conditionReady, Status: metav1.ConditionFalse, Reason: ref.reason, ObservedGeneration: rn.Generation, Message: ref.message,
		})
		// Namespaces are not watched: a label added later applies within
		// policyRecheck.
		return ctrl.Result{RequeueAfter: min(renewIn, policyRecheck)}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
	}

	r.refusalsTold.Delete(req.NamespacedName) // a later refusal is news again
	refuseEgress, err := r.Policy.refusesNodeEgress(ctx, r.Client, &rn)
	if err != nil {
		return ctrl.Result{}, err
	}
	ds, err := r.ensureWorkload(ctx, &rn, refuseEgress)
	if err != nil {
		return ctrl.Result{}, err
	}
	status.Desired, status.Ready = ds.Status.DesiredNumberScheduled, ds.Status.NumberReady
	if status.Endpoints, err = r.endpoints(ctx, &rn); err != nil {
		return ctrl.Result{}, err
	}
	cond := metav1.Condition{Type: conditionReady, ObservedGeneration: rn.Generation}
	switch {
	case status.Ready > 0 && len(status.Endpoints) > 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonRelaysReady
		cond.Message = fmt.Sprintf("%d of %d relay pods ready", status.Ready, status.Desired)
	case status.Desired == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoNodes
		cond.Message = "no node runs this relay yet: check spec.nodeSelector and spec.tolerations against the nodes' labels and taints"
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonRelaysNotReady
		cond.Message = fmt.Sprintf("0 of %d relay pods ready: see `kubectl -n %s get pods -l %s=%s`", status.Desired, rn.Namespace, LabelRelayNode, rn.Name)
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	for _, c := range []*metav1.Condition{r.Reports.healthy(&rn), r.Reports.congestion(&rn)} {
		if c != nil {
			c.ObservedGeneration = rn.Generation
			meta.SetStatusCondition(&status.Conditions, *c)
		}
	}
	return ctrl.Result{RequeueAfter: renewIn}, patchStatus(ctx, r.Client, &rn, &rn.Status, status)
}

// policyRecheck is how soon a refused RelayNode is looked at again.
const policyRecheck = 30 * time.Second

// days says d in days, or hours under two days.
func days(d time.Duration) string {
	if d < 48*time.Hour {
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%.1f days", d.Hours()/24)
}

// apiReader reads from the API server (the cache when none is given, in
// tests).
func (r *RelayNodeReconciler) apiReader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

// refusal checks a RelayNode against the operator's policy.
func (r *RelayNodeReconciler) refusal(ctx context.Context, rn *v1alpha1.RelayNode) (*refusal, error) {
	reason, message, err := r.Policy.Refusal(ctx, r.apiReader(), rn)
	if err != nil || reason == "" {
		return nil, err
	}
	return &refusal{reason, message}, nil
}

// relayNameHolder returns the namespace of a RelayNode that keeps rn from
// holding its name ("" when rn holds it). Relays trust a peer by the name
// in its certificate, and one CA signs every namespace's, so a name is one
// relay across the cluster: the oldest RelayNode of that name holds it and
// no other may get a certificate for it, neither its Secret (the
// reconciler) nor its pods (the signer, the webhook). Creation times have
// whole seconds, so two of the same second cannot tell which came first:
// neither holds the name, or one created just after another had its
// certificate would take the name and get one too. c may be the cache or
// the API server; namespaces, when given, are those to look in (an
// operator confined to them may not list the cluster's).
func relayNameHolder(ctx context.Context, c client.Reader, rn *v1alpha1.RelayNode, namespaces ...string) (string, error) {
	var lists []client.ListOption
	for _, ns := range namespaces {
		lists = append(lists, client.InNamespace(ns))
	}
	if len(lists) == 0 {
		lists = []client.ListOption{client.InNamespace("")}
	}
	for _, in := range lists {
		var same v1alpha1.RelayNodeList
		if err := c.List(ctx, &same, in, client.MatchingFields{indexName: rn.Name}); err != nil {
			return "", fmt.Errorf("list RelayNodes named %q: %w", rn.Name, err)
		}
		for _, o := range same.Items {
			if o.Namespace != rn.Namespace && !rn.CreationTimestamp.Before(&o.CreationTimestamp) {
				return o.Namespace, nil
			}
		}
	}
	return "", nil
}

// ensureCertificate keeps a valid certificate for the relay in its Secret,
// issuing a new one when it is missing, expiring, for another name or from
// another CA. It returns the certificate's expiry, or the namespace of a
// RelayNode that holds the name, in which case it issued nothing.
func (r *RelayNodeReconciler) ensureCertificate(ctx context.Context, rn *v1alpha1.RelayNode) (notAfter time.Time, holder string, err error) {
	if err := r.deleteSecretOfType(ctx, rn, corev1.SecretTypeTLS); err != nil {
		return time.Time{}, "", fmt.Errorf("relay Secret without a key: %w", err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: RelayObjectName(rn.Name), Namespace: rn.Namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, r.Client, s, func() error {
		s.Labels = relayLabels(rn.Name)
		s.Type = corev1.SecretTypeTLS
		if err := controllerutil.SetControllerReference(rn, s, r.Scheme); err != nil {
			return err
		}
		if exp, ok := r.certStillGood(rn.Namespace, rn.Name, s.Data); ok {
			notAfter = exp
			// A new trust bundle reaches the relay without a new certificate.
			s.Data[keyCACert] = r.CA.TrustPEM()
			return nil
		}
		// Who holds the name is asked of the API server before a key is
		// made, as the signer asks it: a cache that has not seen an older
		// RelayNode of the name yet would give this one a key for it. Only
		// here, not at every reconcile: issuing is rare, reconciles are not.
		switch other, err := relayNameHolder(ctx, r.apiReader(), rn, r.Namespaces...); {
		case err != nil:
			return err
		case other != "":
			holder = other
			return errNameHeld
		}
		certPEM, keyPEM, err := r.CA.IssueIn(rn.Namespace, rn.Name, r.validity())
		if err != nil {
			return err
		}
		s.Data = map[string][]byte{keyCert: certPEM, keyKey: keyPEM, keyCACert: r.CA.TrustPEM()}
		notAfter, err = certNotAfter(certPEM)
		return err
	})
	switch {
	case errors.Is(err, errNameHeld):
		return time.Time{}, holder, nil
	case err != nil:
		return time.Time{}, "", fmt.Errorf("relay certificate Secret: %w", err)
	}
	return notAfter, "", nil
}

// errNameHeld stops a Secret's update: another RelayNode holds the name.
var errNameHeld = errors.New("another RelayNode holds the name")

// certStillGood: the Secret's certificate is for name in namespace ns,
// from the CA that signs now (after a rotation, every relay gets one of the
// new CA), no longer-lived than Validity (an older operator's year-long
// one is replaced at once), and far from its expiry.
func (r *RelayNodeReconciler) certStillGood(ns, name string, data map[string][]byte) (time.Time, bool) {
	id, err := pki.NewIdentity(name, r.CA.PEM, data[keyCert], data[keyKey])
	if err != nil {
		return time.Time{}, false
	}
	leaf := id.Cert.Leaf
	if certNS, relay, ok, err := pki.RelayOf(leaf); err != nil || !ok || certNS != ns || relay != name {
		return time.Time{}, false
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) > r.validity()+2*time.Hour { // issue backdates an hour
		return time.Time{}, false
	}
	exp := leaf.NotAfter
	return exp, time.Until(exp) > r.RenewBefore
}

func (r *RelayNodeReconciler) validity() time.Duration {
	if r.Validity > 0 {
		return r.Validity
	}
	return pki.ClusterRelayValidity
}

// ensureTrustOnly keeps a sidecar RelayNode's Secret, in pod-certificate
// mode, to the CAs its relays trust (ca.crt, which the webhook projects
// beside each pod's own key and certificate): no key. A Secret an older
// operator (or Secret mode) filled with a key and certificate is replaced:
// its type, kubernetes.io/tls, needs both and cannot change in place.
func (r *RelayNodeReconciler) ensureTrustOnly(ctx context.Context, rn *v1alpha1.RelayNode) error {
	if err := r.deleteSecretOfType(ctx, rn, corev1.SecretTypeOpaque); err != nil {
		return fmt.Errorf("relay Secret with a key, in pod-certificate mode: %w", err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: RelayObjectName(rn.Name), Namespace: rn.Namespace}}
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, s, func() error {
		s.Labels = relayLabels(rn.Name)
		s.Type = corev1.SecretTypeOpaque
		s.Data = map[string][]byte{keyCACert: r.CA.TrustPEM()}
		return controllerutil.SetControllerReference(rn, s, r.Scheme)
	})
	if err != nil {
		return fmt.Errorf("relay trust Secret: %w", err)
	}
	return nil
}

// deleteSecretOfType deletes rn's Secret if it is of another type than
// want, which an update cannot change: a RelayNode moved into or out of
// sidecar mode with pod certificates.
func (r *RelayNodeReconciler) deleteSecretOfType(ctx context.Context, rn *v1alpha1.RelayNode, want corev1.SecretType) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: RelayObjectName(rn.Name), Namespace: rn.Namespace}}
	switch err := r.Get(ctx, client.ObjectKeyFromObject(s), s); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	if s.Type == want || !metav1.IsControlledBy(s, rn) {
		return nil
	}
	if err := r.Delete(ctx, s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// podCertsNotAfter is a pod-certificate sidecar's status.certificateNotAfter:
// when a pod certificate the signer issues now expires, kept while more
// than two thirds of a pod certificate's lifetime ahead so that the status
// is not rewritten at every reconcile. It says, as for other RelayNodes,
// that the operator confirmed the name (manifest.HeldNames).
func podCertsNotAfter(prev *metav1.Time, now time.Time) *metav1.Time {
	if prev != nil && prev.Sub(now) > podCertLifetime*2/3 && prev.Sub(now) <= podCertLifetime {
		return prev
	}
	return &metav1.Time{Time: now.Add(podCertLifetime).Truncate(time.Second)}
}

// ensureWorkload creates or updates the relay's ServiceAccount, Role,
// RoleBinding and DaemonSet.
func (r *RelayNodeReconciler) ensureWorkload(ctx context.Context, rn *v1alpha1.RelayNode, refuseEgress bool) (*appsv1.DaemonSet, error) {
	name := RelayObjectName(rn.Name)
	om := func() metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: rn.Namespace} }
	own := func(o client.Object, mutate func()) error { return r.own(ctx, rn, o, mutate) }
	sa := &corev1.ServiceAccount{ObjectMeta: om()}
	if err := own(sa, func() {}); err != nil {
		return nil, err
	}
	role := &rbacv1.Role{ObjectMeta: om()}
	if err := own(role, func() { role.Rules = relayRules(rn.Name) }); err != nil {
		return nil, err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: om()}
	if err := own(rb, func() {
		rb.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: rn.Namespace}}
	}); err != nil {
		return nil, err
	}
	ds := &appsv1.DaemonSet{ObjectMeta: om()}
	want := r.daemonSetSpec(rn, refuseEgress)
	if err := own(ds, func() {
		// The API server fills defaults into what we send (pull policy,
		// update strategy, ...): compare only the fields we set, or every
		// reconcile would rewrite the DaemonSet.
		// Arguments are compared whole: to DeepDerivative, arguments
		// that lost their last one (--refuse-node-egress) are the same.
		if !equality.Semantic.DeepDerivative(want, ds.Spec) || !sameArgs(want, ds.Spec) {
			ds.Spec = want
		}
	}); err != nil {
		return nil, err
	}
	return ds, nil
}

// sameArgs: the containers of a and b have the same arguments (the API
// server defaults none).
func sameArgs(a, b appsv1.DaemonSetSpec) bool {
	ac, bc := a.Template.Spec.Containers, b.Template.Spec.Containers
	if len(ac) != len(bc) {
		return false
	}
	for i := range ac {
		if !slices.Equal(ac[i].Args, bc[i].Args) {
			return false
		}
	}
	return true
}

// own creates or updates o as an object of rn's, labelled as its relay's:
// mutate sets what o should hold.
func (r *RelayNodeReconciler) own(ctx context.Context, rn *v1alpha1.RelayNode, o client.Object, mutate func()) error {
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, o, func() error {
		o.SetLabels(relayLabels(rn.Name))
		mutate()
		return controllerutil.SetControllerReference(rn, o, r.Scheme)
	})
	if err != nil {
		return fmt.Errorf("%T %s: %w", o, o.GetName(), err)
	}
	return nil
}

// relayRules is what a relay may read: the hoplink objects of its namespace,
// the EndpointSlices that list sidecar relays' replicas and its own
// certificate Secret, nothing else.
func relayRules(relay string) []rbacv1.PolicyRule {
	return append(sidecarRules(),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{RelayObjectName(relay)}, Verbs: []string{"get", "list", "watch"}})
}

// sidecarRules is what a sidecar relay reads with its pod's service
// account: no Secret (its certificate is a mounted volume).
//
// A relay watches only the objects carrying its member label, but RBAC
// cannot grant list or watch by label (nor by name, but for one object
// named in a field selector, as its Secret is): it may list every
// RelayNode, Chain, Tunnel and EndpointSlice of its namespace. What it
// needs of them is list and watch (its cache), and get of its own
// RelayNode alone (to say why it is missing); get of the others, which no
// relay asks, is not granted.
func sidecarRules() []rbacv1.PolicyRule {
	read := []string{"get", "list", "watch"}
	cached := []string{"list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"relaynodes"}, Verbs: read},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"chains", "tunnels"}, Verbs: cached},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: cached},
		// The clusterset report its cluster's operator stores (multicluster
		// mode), which relays serve to other clusters' operators.
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{v1alpha1.ClusterSetReportName}, Verbs: read},
	}
}

// daemonSetSpec is rn's DaemonSet; with refuseEgress its relays refuse
// their node to every Tunnel (RelayPolicy.refusesNodeEgress).
func (r *RelayNodeReconciler) daemonSetSpec(rn *v1alpha1.RelayNode, refuseEgress bool) appsv1.DaemonSetSpec {
	labels := relayLabels(rn.Name)
	hostNet := rn.Spec.HostNetwork == nil || *rn.Spec.HostNetwork
	image := rn.Spec.Image
	if image == "" {
		image = r.Image
	}
	port, mport := rn.Spec.Listen.Port, MetricsPort(rn)
	if port == 0 {
		port = v1alpha1.DefaultRelayPort
	}
	c := corev1.Container{
		Name:  "relay",
		Image: image,
		Args: []string{"relay", "--kube", "--name", rn.Name, "--namespace", rn.Namespace,
			"--metrics-addr", inject.MetricsAddr(mport), "--drain-timeout", itoa(v1alpha1.DefaultDrainSeconds) + "s"},
		Env: []corev1.EnvVar{inject.PodIPEnv},
		Ports: []corev1.ContainerPort{
			{Name: "quic", ContainerPort: port, Protocol: corev1.ProtocolUDP},
			{Name: "tls", ContainerPort: port, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: mport, Protocol: corev1.ProtocolTCP},
		},
		ReadinessProbe:  httpProbe("/readyz", mport, 5),
		LivenessProbe:   httpProbe("/healthz", mport, 10),
		SecurityContext: inject.RelaySecurityContext(rn.Spec.TUN),
	}
	if refuseEgress {
		c.Args = append(c.Args, "--refuse-node-egress")
	}
	switch {
	case rn.Spec.Resources != nil:
		c.Resources = *rn.Spec.Resources
	case r.Resources != nil:
		c.Resources = *r.Resources.DeepCopy()
	}
	var volumes []corev1.Volume
	if rn.Spec.TUN {
		volumes = []corev1.Volume{{Name: "dev-net-tun", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/net/tun", Type: ptr.To(corev1.HostPathCharDev)}}}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "dev-net-tun", MountPath: "/dev/net/tun"}}
	}
	if hostNet { // what the API server would default; said here so comparisons match
		for i := range c.Ports {
			c.Ports[i].HostPort = c.Ports[i].ContainerPort
		}
	}
	dns := corev1.DNSClusterFirst
	if hostNet {
		dns = corev1.DNSClusterFirstWithHostNet
	}
	var spec appsv1.DaemonSetSpec
	spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{LabelRelayNode: rn.Name}}
	spec.Template.ObjectMeta.Labels = labels
	spec.Template.Spec = corev1.PodSpec{
		ServiceAccountName: RelayObjectName(rn.Name),
		HostNetwork:        hostNet,
		DNSPolicy:          dns,
		NodeSelector:       rn.Spec.NodeSelector,
		Tolerations:        rn.Spec.Tolerations,
		Containers:         []corev1.Container{c},
		Volumes:            volumes,
		// Let open flows finish when a relay is replaced: the relay drains
		// for --drain-timeout after SIGTERM; a little more before SIGKILL.
		TerminationGracePeriodSeconds: ptr.To[int64](v1alpha1.DefaultDrainSeconds + drainSlack),
	}
	if !hostNet && r.BufferSysctls {
		spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: slices.Clone(linkBufferSysctls)}
	}
	return spec
}

// drainSlack is the time a relay pod has after its drain to close before
// the kubelet kills it.
const drainSlack = 5

// httpProbe spells out the numbers the API server would default, so that
// comparing with the stored DaemonSet sees no change where there is none.
func httpProbe(path string, port, period int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}},
		PeriodSeconds: period, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
	}
}

// deleteWorkload removes the pods' objects of a RelayNode that became
// external; its certificate Secret stays.
func (r *RelayNodeReconciler) deleteWorkload(ctx context.Context, rn *v1alpha1.RelayNode) error {
	om := metav1.ObjectMeta{Name: RelayObjectName(rn.Name), Namespace: rn.Namespace}
	for _, o := range []client.Object{&appsv1.DaemonSet{ObjectMeta: om}, &rbacv1.RoleBinding{ObjectMeta: om}, &rbacv1.Role{ObjectMeta: om}, &corev1.ServiceAccount{ObjectMeta: om}} {
		if err := r.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// endpoints are spec.endpoints when given, else the addresses of every
// running relay pod (podEndpoints). Running, not ready: a relay is ready
// once it has applied its RelayNode, whose relays need endpoints to be
// valid, so waiting for readiness deadlocked every relay that started after
// a Chain named it.
func (r *RelayNodeReconciler) endpoints(ctx context.Context, rn *v1alpha1.RelayNode) ([]string, error) {
	if len(rn.Spec.Endpoints) > 0 {
		return slices.Clone(rn.Spec.Endpoints), nil
	}
	pods, err := relayPods(ctx, r.Client, rn.Namespace, rn.Name)
	if err != nil {
		return nil, err
	}
	port := rn.Spec.Listen.Port
	if port == 0 {
		port = v1alpha1.DefaultRelayPort
	}
	return podEndpoints(pods.Items, port), nil
}

// podEndpoints are the relay addresses of the running pods: the node's for
// host-network relays, the pod's otherwise, of every family it has
// (status.podIPs, status.hostIPs), so a dual-stack relay is published on
// both and its peers dial what works (package relay/eyeballs). The
// singular fields stand in where the plural ones are empty (a kubelet
// before hostIPs, a pod written by hand), sorted and without repeats.
func podEndpoints(pods []corev1.Pod, port int32) []string {
	var out []string
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || !p.DeletionTimestamp.IsZero() {
			continue
		}
		ips := podIPs(&p)
		if p.Spec.HostNetwork {
			ips = []string{p.Status.HostIP}
			for _, ip := range p.Status.HostIPs {
				ips = append(ips, ip.IP)
			}
		}
		for _, ip := range ips {
			if ip != "" {
				out = append(out, net.JoinHostPort(ip, itoa(port)))
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// podIPs are a pod's addresses of every family, status.podIP first (the
// primary), without repeats; status.podIP alone where status.podIPs is
// empty.
func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range append([]string{p.Status.PodIP}, podIPList(p.Status.PodIPs)...) {
		if ip != "" && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

func podIPList(ips []corev1.PodIP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.IP
	}
	return out
}

// oneFamily keeps, of endpoints that hold both IP families, those of the
// family most of them have (the first's on a tie): each relay pod of a
// dual-stack cluster then once, for the operator's own questions, whose
// answers it merges across pods and must not count twice. Names and
// single-family lists pass as they are.
func oneFamily(eps []string) []string {
	family := func(ep string) int {
		host, _, err := net.SplitHostPort(ep)
		if err != nil {
			return 0
		}
		a, err := netip.ParseAddr(host)
		switch {
		case err != nil:
			return 0
		case a.Unmap().Is4():
			return 4
		default:
			return 6
		}
	}
	n := map[int]int{}
	for _, ep := range eps {
		n[family(ep)]++
	}
	if n[4] == 0 || n[6] == 0 {
		return eps
	}
	keep := family(eps[0])
	switch {
	case n[4] > n[6]:
		keep = 4
	case n[6] > n[4]:
		keep = 6
	case keep == 0:
		keep = 4
	}
	var out []string
	for _, ep := range eps {
		if f := family(ep); f == keep || f == 0 {
			out = append(out, ep)
		}
	}
	return out
}

// indexPodRelay indexes the cache's pods by the RelayNode they run
// (their LabelRelayNode). Selected by label, every RelayNode reconcile
// scanned every relay pod of the namespace: 5,500 at issue 41's full
// size, where listing them was 46 % of the operator's CPU.
const indexPodRelay = "hoplink.pod.relay"

// relayPods lists the pods of RelayNode relay in ns: by the cache's index,
// or by label from a reader without it (the API server, in tests).
func relayPods(ctx context.Context, c client.Reader, ns, relay string) (*corev1.PodList, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingFields{indexPodRelay: relay}); err == nil {
		return &pods, nil
	}
	pods = corev1.PodList{}
	err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{LabelRelayNode: relay})
	return &pods, err
}

// indexName indexes RelayNodes by name across namespaces, for the name
// check. It is the API server's own field, so the same list works on the
// cache and on the API server.
const indexName = "metadata.name"

// SetupWithManager registers the reconciler and its watches.
func (r *RelayNodeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	// A renewal window as long as the validity would reissue at every
	// reconcile.
	if r.RenewBefore == 0 || r.RenewBefore >= r.validity() {
		r.RenewBefore = r.validity() / 3
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.RelayNode{}, indexName,
		func(o client.Object) []string { return []string{o.GetName()} }); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, indexPodRelay, func(o client.Object) []string {
		if relay := o.GetLabels()[LabelRelayNode]; relay != "" {
			return []string{relay}
		}
		return nil
	}); err != nil {
		return err
	}
	memberHandler, memberChange := enqueueChainMembers()
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Reports != nil {
		b = b.WatchesRawSource(source.Channel(r.Reports.relays, &handler.EnqueueRequestForObject{}))
	}
	if r.Policy.NamespaceLabels {
		// A namespace's labels allow its RelayNodes privileges and the
		// node's network: a change applies at once, not at the next
		// reconcile (a namespace-scoped operator reads no namespaces).
		b = b.Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var in v1alpha1.RelayNodeList
			if err := mgr.GetClient().List(ctx, &in, client.InNamespace(o.GetName())); err != nil {
				log.FromContext(ctx).Error(err, "list RelayNodes of a namespace")
				return nil
			}
			out := make([]reconcile.Request, 0, len(in.Items))
			for _, rn := range in.Items {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: rn.Namespace, Name: rn.Name}})
			}
			return out
		}), builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
			UpdateFunc: func(e event.UpdateEvent) bool {
				for _, l := range []string{LabelPrivilegedRelays, LabelControlPlaneRelays, v1alpha1.LabelEgressHost} {
					if e.ObjectOld.GetLabels()[l] != e.ObjectNew.GetLabels()[l] {
						return true
					}
				}
				return false
			},
		}))
	}
	self, selfUrgent := urgentSelf()
	return b.
		For(&v1alpha1.RelayNode{}).
		Watches(&v1alpha1.RelayNode{}, self, selfUrgent).
		WithOptions(controller.Options{MaxConcurrentReconciles: relayNodeWorkers}).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.Secret{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&corev1.Service{}).
		// Ready pods are the endpoints; they belong to the DaemonSet, so map them by label.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if name := o.GetLabels()[LabelRelayNode]; name != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
			}
			return nil
		})).
		// Relays gain or lose this RelayNode with the Chains they share.
		Watches(&v1alpha1.Chain{}, urgentWhen(memberHandler, specOrMembers), builder.WithPredicates(memberChange)).
		// A RelayNode deleted in one namespace may free its name for another.
		Watches(&v1alpha1.RelayNode{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var same v1alpha1.RelayNodeList
			if err := mgr.GetClient().List(ctx, &same, client.MatchingFields{indexName: o.GetName()}); err != nil {
				log.FromContext(ctx).Error(err, "list RelayNodes by name")
				return nil
			}
			var out []reconcile.Request
			for _, s := range same.Items {
				if s.Namespace != o.GetNamespace() {
					out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
				}
			}
			return out
		})).
		Complete(r)
}
