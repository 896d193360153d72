package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/pki"
)

func TestRelayNodeBecomesDaemonSetWithCertificateAndRBAC(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "hk", func(r *v1alpha1.RelayNode) {
		r.Spec.Listen.Port = 7500
		r.Spec.NodeSelector = map[string]string{"hoplink.dev/edge": "true"}
		r.Spec.Tolerations = []corev1.Toleration{{Key: "edge", Operator: corev1.TolerationOpExists}}
	})
	create(t, rn)
	name := types.NamespacedName{Namespace: ns, Name: RelayObjectName("hk")}

	ds := &appsv1.DaemonSet{}
	eventually(t, "DaemonSet", func() error { return k8s.Get(ctx, name, ds) })
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if !pod.HostNetwork || pod.NodeSelector["hoplink.dev/edge"] != "true" || len(pod.Tolerations) != 1 || pod.ServiceAccountName != name.Name {
		t.Errorf("pod spec does not follow the RelayNode: %+v", pod)
	}
	// A host-network relay in a namespace without hoplink.dev/egress-host=true.
	if c.Image != "hoplink:test" || strings.Join(c.Args, " ") != "relay --kube --name hk --namespace "+ns+" --metrics-addr [$(POD_IP)]:7501 --drain-timeout 30s --refuse-node-egress" {
		t.Errorf("container: image %s args %v", c.Image, c.Args)
	}
	// The kubelet waits for the relay's drain before it kills the pod.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= 30 {
		t.Errorf("terminationGracePeriodSeconds %v: the relay drains for 30s and needs a little more", g)
	}
	if c.Ports[0].ContainerPort != 7500 || c.Ports[0].Protocol != corev1.ProtocolUDP || c.ReadinessProbe.HTTPGet.Port.IntVal != 7501 {
		t.Errorf("ports/probes: %+v %+v", c.Ports, c.ReadinessProbe)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("relay must run as non-root without capabilities: %+v", sc)
	}
	if !metav1.IsControlledBy(ds, rn) {
		t.Error("DaemonSet is not owned by the RelayNode, so it would outlive it")
	}

	var role rbacv1.Role
	eventually(t, "Role", func() error { return k8s.Get(ctx, name, &role) })
	for _, rule := range role.Rules {
		for _, v := range rule.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("relay Role may %s %v: a relay needs read access only", v, rule.Resources)
			}
		}
		if len(rule.Resources) == 1 && rule.Resources[0] == "secrets" && (len(rule.ResourceNames) != 1 || rule.ResourceNames[0] != name.Name) {
			t.Errorf("relay may read Secrets %v; it needs only its own", rule.ResourceNames)
		}
		// Its cache lists and watches; it gets nothing by name but its
		// own RelayNode and the objects its rules name.
		if slices.Contains(rule.Verbs, "get") && len(rule.ResourceNames) == 0 && !slices.Equal(rule.Resources, []string{"relaynodes"}) {
			t.Errorf("relay may get any of %v by name; it needs list and watch", rule.Resources)
		}
	}
	var rb rbacv1.RoleBinding
	eventually(t, "RoleBinding", func() error { return k8s.Get(ctx, name, &rb) })
	if rb.Subjects[0].Name != name.Name || rb.RoleRef.Name != name.Name {
		t.Errorf("RoleBinding binds %v to %v", rb.Subjects, rb.RoleRef)
	}
	var sa corev1.ServiceAccount
	eventually(t, "ServiceAccount", func() error { return k8s.Get(ctx, name, &sa) })

	var secret corev1.Secret
	eventually(t, "certificate Secret", func() error { return k8s.Get(ctx, name, &secret) })
	caSecret := corev1.Secret{}
	if err := k8s.Get(ctx, testCA, &caSecret); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.NewIdentity("hk", caSecret.Data["tls.crt"], secret.Data["tls.crt"], secret.Data["tls.key"]); err != nil {
		t.Errorf("relay certificate is not valid for hk under the operator's CA: %v", err)
	}
	if string(secret.Data["ca.crt"]) != string(caSecret.Data["tls.crt"]) {
		t.Error("relay Secret does not carry the CA certificate")
	}

	cond := waitReason(t, rn, "NoNodes")
	if !strings.Contains(cond.Message, "nodeSelector") {
		t.Errorf("NoNodes message does not say what to check: %s", cond.Message)
	}
	runRelayPod(t, rn, "192.0.2.7")
	waitReason(t, rn, "RelaysReady")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
		t.Fatal(err)
	}
	if got := rn.Status.Endpoints; len(got) != 1 || got[0] != "192.0.2.7:7500" {
		t.Errorf("endpoints %v, want the node address of the host-network pod", got)
	}
	if rn.Status.Desired != 1 || rn.Status.Ready != 1 || rn.Status.CertificateNotAfter == nil {
		t.Errorf("status %+v", rn.Status)
	}

	// A reconcile with nothing to change writes nothing: the API server's
	// defaults in the DaemonSet are not a change.
	if err := k8s.Get(ctx, name, ds); err != nil {
		t.Fatal(err)
	}
	dsVersion := ds.ResourceVersion
	writesBefore := apiWrites(t)
	rn.Annotations = map[string]string{"touched": "yes"}
	if err := k8s.Update(ctx, rn); err != nil {
		t.Fatal(err)
	}
	rnVersion := rn.ResourceVersion
	time.Sleep(2 * time.Second)
	// The API server skips a no-op update without a new resourceVersion, so
	// count requests too: the test's own update is the only write.
	if w := apiWrites(t) - writesBefore; w != 1 {
		t.Errorf("%d API writes after touching the RelayNode; want 1 (the touch itself)", w)
	}
	if err := k8s.Get(ctx, name, ds); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
		t.Fatal(err)
	}
	if ds.ResourceVersion != dsVersion || rn.ResourceVersion != rnVersion {
		t.Errorf("a reconcile with nothing to change wrote: DaemonSet %s -> %s, RelayNode %s -> %s",
			dsVersion, ds.ResourceVersion, rnVersion, rn.ResourceVersion)
	}
}

func TestRelayNodeStatusIsNotRewrittenWhenNothingChanged(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "quiet", external("203.0.113.1:7401"))
	create(t, rn)
	waitReason(t, rn, "External")
	before := rn.ResourceVersion
	// A change to an owned object requeues the RelayNode; its status is already right.
	var secret corev1.Secret
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName("quiet")}, &secret); err != nil {
		t.Fatal(err)
	}
	secret.Annotations = map[string]string{"touched": "yes"}
	if err := k8s.Update(ctx, &secret); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
		t.Fatal(err)
	}
	if rn.ResourceVersion != before {
		t.Errorf("RelayNode was written again (resourceVersion %s -> %s) though nothing changed", before, rn.ResourceVersion)
	}
	var ds appsv1.DaemonSet
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName("quiet")}, &ds); !apierrors.IsNotFound(err) {
		t.Errorf("an external relay got a DaemonSet (err %v)", err)
	}
}

func TestRelayCertificateIsReissuedWhenNotFromTheCA(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	create(t, relayNode(ns, "rot", external("203.0.113.2:7401")))
	key := types.NamespacedName{Namespace: ns, Name: RelayObjectName("rot")}
	var secret corev1.Secret
	eventually(t, "certificate Secret", func() error { return k8s.Get(ctx, key, &secret) })
	foreign, err := pki.NewCA("someone else")
	if err != nil {
		t.Fatal(err)
	}
	c, k, _ := foreign.Issue("rot")
	secret.Data["tls.crt"], secret.Data["tls.key"] = c, k
	if err := k8s.Update(ctx, &secret); err != nil {
		t.Fatal(err)
	}
	eventually(t, "certificate reissued under the operator's CA", func() error {
		if err := k8s.Get(ctx, key, &secret); err != nil {
			return err
		}
		_, err := pki.NewIdentity("rot", secret.Data["ca.crt"], secret.Data["tls.crt"], secret.Data["tls.key"])
		if err == nil && string(secret.Data["tls.crt"]) == string(c) {
			return fmt.Errorf("still the foreign certificate")
		}
		return err
	})
}

func TestCertificateRenewalWindow(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	pair := func(c, k []byte, err error) map[string][]byte {
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca.PEM}
	}
	data := pair(ca.IssueIn("edge", "hk", pki.ClusterRelayValidity))
	for _, tc := range []struct {
		renewBefore time.Duration
		ns, relay   string
		data        map[string][]byte
		kept        bool
		otherwise   string
	}{
		{pki.ClusterRelayValidity / 3, "edge", "hk", data, true, "a fresh certificate was judged due for renewal"},
		{pki.ClusterRelayValidity, "edge", "hk", data, false, "a certificate inside the renewal window was kept"},
		{time.Hour, "edge", "la", data, false, "a certificate for another relay name was kept"},
		{time.Hour, "other", "hk", data, false, "a certificate of another namespace was kept"},
		{time.Hour, "edge", "hk", pair(ca.Issue("hk")), false, "a certificate without a namespace (an older operator's) was kept"},
		{time.Hour, "edge", "hk", pair(ca.IssueIn("edge", "hk", pki.RelayValidity)), false, "a year-long certificate was kept"},
	} {
		if _, ok := (&RelayNodeReconciler{CA: ca, RenewBefore: tc.renewBefore}).certStillGood(tc.ns, tc.relay, tc.data); ok != tc.kept {
			t.Error(tc.otherwise)
		}
	}
}

func TestRelayNodeNamesAreUniqueAcrossNamespaces(t *testing.T) {
	needAPI(t)
	a, b := namespace(t), namespace(t)
	ext := external("203.0.113.3:7401")
	first := relayNode(a, "twin", ext)
	create(t, first)
	waitReason(t, first, "External")
	second := relayNode(b, "twin", ext)
	create(t, second)
	cond := waitReason(t, second, "NameConflict")
	if !strings.Contains(cond.Message, a) {
		t.Errorf("conflict message does not name the other namespace: %s", cond.Message)
	}
	var s corev1.Secret
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: b, Name: RelayObjectName("twin")}, &s); !apierrors.IsNotFound(err) {
		t.Errorf("the second %q got a certificate (err %v): it could pose as the first", "twin", err)
	}
}

// Creation times have whole seconds. A RelayNode created in the same
// second as one that already had its certificate, in a namespace first in
// order, took the name and got a certificate too: two relays of one name.
func TestRelayNodeNamesTiedInOneSecondAreNobodys(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ext := external("203.0.113.4:7401")
	secret := func(ns, name string) error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(name)}, &corev1.Secret{})
	}
	for round := range 5 {
		early, late := namespace(t), namespace(t)
		if early > late {
			early, late = late, early
		}
		name := fmt.Sprintf("tied-%d", round)
		// Start just after a second begins, so that both fit in it.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
		incumbent := relayNode(late, name, ext)
		create(t, incumbent)
		eventually(t, "the first RelayNode's certificate", func() error { return secret(late, name) })
		newcomer := relayNode(early, name, ext)
		create(t, newcomer)
		if !incumbent.CreationTimestamp.Equal(&newcomer.CreationTimestamp) {
			t.Logf("round %d: created %v and %v, not in one second; again", round, incumbent.CreationTimestamp, newcomer.CreationTimestamp)
			continue
		}
		if c := waitReason(t, newcomer, ReasonNameConflict); !strings.Contains(c.Message, late) {
			t.Errorf("the newcomer's conflict does not name %s: %s", late, c.Message)
		}
		waitReason(t, incumbent, ReasonNameConflict)
		if err := secret(early, name); !apierrors.IsNotFound(err) {
			t.Errorf("the RelayNode created in the same second in %s got a certificate for %q too (err %v)", early, name, err)
		}
		return
	}
	t.Fatal("no two RelayNodes were created in one second in 5 rounds")
}

// A relay pod that runs but is not ready yet has its address published: the
// relay becomes ready only once its peers' RelayNodes, endpoints included,
// are valid, so publishing only ready relays deadlocked chains whose relays
// started together (seen in the kind e2e).
func TestEndpointsOfRunningRelayBeforeReady(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "la", listenPort(7600))
	create(t, rn)
	relayPod(t, rn, corev1.PodStatus{HostIP: "172.18.0.7", PodIP: "172.18.0.7", Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}})
	eventually(t, "endpoint of the running relay", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			return err
		}
		if !slices.Equal(rn.Status.Endpoints, []string{"172.18.0.7:7600"}) {
			return fmt.Errorf("status.endpoints %v", rn.Status.Endpoints)
		}
		return nil
	})
}

// A relay on a dual-stack node is published on both of its families, as the
// API server stores them (status.hostIPs; podIPs mirror them on the host
// network), so peers of either family reach it.
func TestEndpointsOfDualStackRelay(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "dual", listenPort(7601))
	create(t, rn)
	relayPod(t, rn, corev1.PodStatus{Phase: corev1.PodRunning,
		HostIP: "172.18.0.7", HostIPs: []corev1.HostIP{{IP: "172.18.0.7"}, {IP: "fc00:f853:ccd:e793::7"}},
		PodIP: "172.18.0.7", PodIPs: []corev1.PodIP{{IP: "172.18.0.7"}, {IP: "fc00:f853:ccd:e793::7"}}})
	eventually(t, "endpoints of both families", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			return err
		}
		if want := []string{"172.18.0.7:7601", "[fc00:f853:ccd:e793::7]:7601"}; !slices.Equal(rn.Status.Endpoints, want) {
			return fmt.Errorf("status.endpoints %v, want %v", rn.Status.Endpoints, want)
		}
		return nil
	})
}

// The operator, not the RelayNode, says which images run and where relays
// may take the host network or a TUN device: a user sees why in the
// RelayNode's Ready condition, and no DaemonSet runs until it is allowed.
func TestRelayNodeAdmissionRules(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t) + "-plain"
	mustCreateNamespaceWith(ctx, ns, nil)
	host := relayNode(ns, "hostnet")
	for _, tc := range []struct {
		rn     *v1alpha1.RelayNode
		reason string // "": allowed
		says   []string
	}{
		{host, "PrivilegesNotAllowed", []string{"spec.hostNetwork", "kubectl label namespace " + ns + " " + LabelPrivilegedRelays + "=true"}},
		{relayNode(ns, "tunrelay", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false); r.Spec.TUN = true }),
			"PrivilegesNotAllowed", []string{"spec.tun", "NET_ADMIN"}},
		{relayNode(ns, "ownimage", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false); r.Spec.Image = "evil.example/relay:1" }),
			"ImageNotAllowed", []string{`spec.image "evil.example/relay:1"`, "hoplink:test", "allowed.example/hoplink:"}},
		// Allowed: pod network with the operator's image or an allowed one.
		{relayNode(ns, "podnet", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false) }), "", nil},
		{relayNode(ns, "allowedimage", func(r *v1alpha1.RelayNode) {
			r.Spec.HostNetwork = ptr.To(false)
			r.Spec.Image = "allowed.example/hoplink:2"
		}), "", nil},
	} {
		create(t, tc.rn)
		if tc.reason == "" {
			var ds appsv1.DaemonSet
			eventually(t, tc.rn.Name+"'s DaemonSet", func() error {
				return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(tc.rn.Name)}, &ds)
			})
			// This API server (1.35 or later) vouches for its kubelets: a
			// relay in the pod network raises its TCP buffers' ceiling.
			if psc := ds.Spec.Template.Spec.SecurityContext; psc == nil || !slices.Equal(psc.Sysctls, linkBufferSysctls) {
				t.Errorf("%s: pod security context %+v, want sysctls %v", tc.rn.Name, psc, linkBufferSysctls)
			}
			continue
		}
		eventually(t, tc.rn.Name+" refused", func() error {
			c, err := readyCondition(tc.rn)
			if err != nil {
				return err
			}
			if c.Status != metav1.ConditionFalse || c.Reason != tc.reason {
				return fmt.Errorf("Ready %s %s: %s", c.Status, c.Reason, c.Message)
			}
			for _, s := range tc.says {
				if !strings.Contains(c.Message, s) {
					return fmt.Errorf("message %q does not say %q", c.Message, s)
				}
			}
			return nil
		})
		var ds appsv1.DaemonSet
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(tc.rn.Name)}, &ds); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a DaemonSet runs although the RelayNode is refused (%v)", tc.rn.Name, err)
		}
	}

	// The namespace opts in: the host-network relay runs, with the
	// runtime's default seccomp profile.
	var nsObj corev1.Namespace
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns}, &nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = map[string]string{LabelPrivilegedRelays: "true"}
	if err := k8s.Update(ctx, &nsObj); err != nil {
		t.Fatal(err)
	}
	// A namespace change is not watched: the next change of the RelayNode
	// (or its requeue within 30 s) applies it.
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(host), host); err != nil {
		t.Fatal(err)
	}
	host.Spec.Endpoints = []string{"198.51.100.1:7401"}
	if err := k8s.Update(ctx, host); err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	eventually(t, "the host-network relay's DaemonSet once the namespace opted in", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(host.Name)}, &ds)
	})
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("relay container seccomp profile %+v, want RuntimeDefault", sc)
	}
	// In the node's network namespace the node's limits hold: a kubelet
	// refuses a pod that sets sysctls there.
	if psc := ds.Spec.Template.Spec.SecurityContext; psc != nil && len(psc.Sysctls) > 0 {
		t.Errorf("the host-network relay's pod sets sysctls %v", psc.Sysctls)
	}
}
