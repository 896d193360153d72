package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/pki"
)

var nsSeq atomic.Int32

// mustCreateNamespace makes a namespace whose RelayNodes may run
// privileged (host-network, TUN) relays, as most tests' do.
func mustCreateNamespace(ctx context.Context, name string) {
	mustCreateNamespaceWith(ctx, name, map[string]string{LabelPrivilegedRelays: "true"})
}

func mustCreateNamespaceWith(ctx context.Context, name string, labels map[string]string) {
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil && !apierrors.IsAlreadyExists(err) {
		panic(err)
	}
}

// namespace gives each test its own namespace.
func namespace(t *testing.T) string {
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 63 {
		name = name[:63]
	}
	name = strings.TrimRight(name, "-")
	mustCreateNamespace(context.Background(), name)
	return name
}

// eventually polls check until it returns nil, for at most 20 s.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

func relayNode(ns, name string, mutate ...func(*v1alpha1.RelayNode)) *v1alpha1.RelayNode {
	rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range mutate {
		m(rn)
	}
	return rn
}

func chain(ns, name string, route ...string) *v1alpha1.Chain {
	c := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.ChainSpec{
		Entry: route[0], Exit: route[len(route)-1], Route: route,
	}}
	if len(route) > 2 {
		c.Spec.Via = route[1 : len(route)-1]
	}
	return c
}

func tunnel(ns, name, chain string, port int32) *v1alpha1.Tunnel {
	return &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.TunnelSpec{
		Chain: chain, Listen: &v1alpha1.TunnelListen{Port: port}, Target: "backend.example:80",
	}}
}

func tunTunnel(ns, name, chain string, mode v1alpha1.TunMode) *v1alpha1.Tunnel {
	return &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.TunnelSpec{
		Chain: chain, Protocol: v1alpha1.ProtocolTUN,
		TUN: &v1alpha1.TunOptions{Address: "10.200.0.1/24", Routes: []string{"10.77.0.0/16"}, Mode: mode},
	}}
}

// readyCondition returns the object's Ready condition, or an error saying it has none.
func readyCondition(o client.Object) (*metav1.Condition, error) {
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		return nil, err
	}
	var conds []metav1.Condition
	switch v := o.(type) {
	case *v1alpha1.RelayNode:
		conds = v.Status.Conditions
	case *v1alpha1.Chain:
		conds = v.Status.Conditions
	case *v1alpha1.Tunnel:
		conds = v.Status.Conditions
	}
	c := meta.FindStatusCondition(conds, conditionReady)
	if c == nil {
		return nil, fmt.Errorf("%s has no Ready condition yet", o.GetName())
	}
	return c, nil
}

func waitReason(t *testing.T, o client.Object, reason string) *metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	eventually(t, fmt.Sprintf("%T %s Ready reason %s", o, o.GetName(), reason), func() error {
		c, err := readyCondition(o)
		if err != nil {
			return err
		}
		if c.Reason != reason {
			return fmt.Errorf("reason %s (%s)", c.Reason, c.Message)
		}
		got = c
		return nil
	})
	return got
}

// runRelayPod stands in for the DaemonSet controller and kubelet, which
// envtest does not run: it reports one scheduled, ready relay pod on a node.
func runRelayPod(t *testing.T, rn *v1alpha1.RelayNode, hostIP string) {
	t.Helper()
	ctx := context.Background()
	ds := &appsv1.DaemonSet{}
	eventually(t, "DaemonSet exists", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: rn.Namespace, Name: RelayObjectName(rn.Name)}, ds)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: rn.Namespace, Name: RelayObjectName(rn.Name) + "-x", Labels: ds.Spec.Template.Labels},
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	create(t, pod)
	pod.Status = corev1.PodStatus{HostIP: hostIP, PodIP: "10.244.0.9", Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
	if err := k8s.Status().Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
}

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
	if c.Image != "hoplink:test" || strings.Join(c.Args, " ") != "relay --kube --relaynode hk --namespace "+ns+" --metrics-addr :7501 --drain-timeout 30s" {
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
	rn := relayNode(ns, "quiet", func(r *v1alpha1.RelayNode) { r.Spec.External = true; r.Spec.Endpoints = []string{"203.0.113.1:7401"} })
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
	create(t, relayNode(ns, "rot", func(r *v1alpha1.RelayNode) { r.Spec.External = true; r.Spec.Endpoints = []string{"203.0.113.2:7401"} }))
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
	c, k, _ := ca.Issue("hk")
	data := map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca.PEM}
	if _, ok := (&RelayNodeReconciler{CA: ca, RenewBefore: pki.RelayValidity / 3}).certStillGood("hk", data); !ok {
		t.Error("a fresh certificate was judged due for renewal")
	}
	if _, ok := (&RelayNodeReconciler{CA: ca, RenewBefore: pki.RelayValidity}).certStillGood("hk", data); ok {
		t.Error("a certificate inside the renewal window was kept")
	}
	if _, ok := (&RelayNodeReconciler{CA: ca, RenewBefore: time.Hour}).certStillGood("la", data); ok {
		t.Error("a certificate for another relay name was kept")
	}
}

func TestRelayNodeNamesAreUniqueAcrossNamespaces(t *testing.T) {
	needAPI(t)
	a, b := namespace(t), namespace(t)
	ext := func(r *v1alpha1.RelayNode) { r.Spec.External = true; r.Spec.Endpoints = []string{"203.0.113.3:7401"} }
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
	ext := func(r *v1alpha1.RelayNode) { r.Spec.External = true; r.Spec.Endpoints = []string{"203.0.113.4:7401"} }
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

func TestChainAndTunnelConditions(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	// Relay names are unique across namespaces (they are certificate
	// names), so this test has its own.
	ch := chain(ns, "east", "c-hk", "c-sea", "c-la")
	create(t, ch)
	cond := waitReason(t, ch, "RelayNotFound")
	if !strings.Contains(cond.Message, `"c-hk"`) {
		t.Errorf("message: %s", cond.Message)
	}
	tn := tunnel(ns, "web", "east", 8080)
	create(t, tn)
	waitReason(t, tn, "ChainNotReady")

	var relays []*v1alpha1.RelayNode
	for i, name := range []string{"c-hk", "c-sea", "c-la"} {
		rn := relayNode(ns, name, func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = int32(7400 + 10*i) })
		create(t, rn)
		relays = append(relays, rn)
	}
	cond = waitReason(t, ch, "RelayNotReady")
	if !strings.Contains(cond.Message, `"c-hk", "c-sea", "c-la"`) {
		t.Errorf("RelayNotReady should name every relay that is not ready: %s", cond.Message)
	}
	for i, rn := range relays {
		runRelayPod(t, rn, fmt.Sprintf("192.0.2.%d", 10+i))
	}
	waitReason(t, ch, "RouteReady")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(ch), ch); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ch.Status.Route, ",") != "c-hk,c-sea,c-la" {
		t.Errorf("status.route %v", ch.Status.Route)
	}
	waitReason(t, tn, "Ready")
	if tn.Status.Address != "web."+ns+".svc:8080" {
		t.Errorf("address %q", tn.Status.Address)
	}
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Selector[LabelRelayNode] != "c-hk" || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP || !metav1.IsControlledBy(&svc, tn) {
		t.Errorf("Service does not front the entry relay's port: %+v", svc.Spec)
	}

	loop := tunnel(ns, "local-only", "east", 8081)
	loop.Spec.Listen.Address = "127.0.0.1"
	create(t, loop)
	waitReason(t, loop, "LoopbackListen")

	// The chain goes away: the Tunnel says so and its Service goes too.
	if err := k8s.Delete(ctx, ch); err != nil {
		t.Fatal(err)
	}
	waitReason(t, tn, "ChainNotFound")
	eventually(t, "Service deleted", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&svc), &svc); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (err %v)", err)
		}
		return nil
	})
}

func TestTunnelDoesNotTakeOverAForeignService(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 5432}}}})
	create(t, chain(ns, "c", "hk"))
	tn := tunnel(ns, "db", "c", 5432)
	create(t, tn)
	waitReason(t, tn, "ServiceConflict")
}

// apiWrites counts the write requests this process's clients have made
// (client-go's rest_client_requests_total, shared by the manager and the test).
func apiWrites(t *testing.T) int {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if f.GetName() != "rest_client_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() != "GET" {
					n += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return n
}

// A tun Tunnel needs its entry relay (and, in packet mode, its exit) to
// open devices: RelayNode spec.tun grants the pods that, and nothing else,
// and the Tunnel names the relays that lack it.
func TestTunTunnelsNeedRelaysWithTUN(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	hk := relayNode(ns, "tun-hk", func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = 7600 })
	la := relayNode(ns, "tun-la", func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = 7610 })
	create(t, hk)
	create(t, la)
	runRelayPod(t, hk, "192.0.2.30")
	runRelayPod(t, la, "192.0.2.31")
	create(t, chain(ns, "c", "tun-hk", "tun-la"))
	flow, packet := tunTunnel(ns, "flow", "c", v1alpha1.TunFlow), tunTunnel(ns, "packet", "c", v1alpha1.TunPacket)
	create(t, flow)
	create(t, packet)
	if c := waitReason(t, flow, "TUNNotAllowed"); !strings.Contains(c.Message, `RelayNode "tun-hk" may not open TUN devices: set spec.tun: true`) {
		t.Errorf("flow mode: %s", c.Message)
	}
	if c := waitReason(t, packet, "TUNNotAllowed"); !strings.Contains(c.Message, `"tun-hk", "tun-la"`) {
		t.Errorf("packet mode must name entry and exit: %s", c.Message)
	}

	dsKey := types.NamespacedName{Namespace: ns, Name: RelayObjectName("tun-hk")}
	podOf := func() (corev1.PodSpec, error) {
		var ds appsv1.DaemonSet
		err := k8s.Get(ctx, dsKey, &ds)
		return ds.Spec.Template.Spec, err
	}
	unprivileged := func(p corev1.PodSpec) error {
		sc := p.Containers[0].SecurityContext
		if !*sc.RunAsNonRoot || len(sc.Capabilities.Add) != 0 || len(p.Volumes) != 0 || len(p.Containers[0].VolumeMounts) != 0 {
			return fmt.Errorf("privileges without spec.tun: %+v, volumes %v", sc, p.Volumes)
		}
		return nil
	}
	if p, err := podOf(); err != nil || unprivileged(p) != nil {
		t.Fatalf("relay without spec.tun: %v %v", err, unprivileged(p))
	}

	setTUN := func(rn *v1alpha1.RelayNode, on bool) {
		t.Helper()
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
			t.Fatal(err)
		}
		rn.Spec.TUN = on
		if err := k8s.Update(ctx, rn); err != nil {
			t.Fatal(err)
		}
	}
	setTUN(hk, true)
	eventually(t, "relay pods with CAP_NET_ADMIN and /dev/net/tun", func() error {
		p, err := podOf()
		if err != nil {
			return err
		}
		sc := p.Containers[0].SecurityContext
		if *sc.RunAsUser != 0 || len(sc.Capabilities.Add) != 1 || sc.Capabilities.Add[0] != "NET_ADMIN" || len(sc.Capabilities.Drop) != 1 || *sc.AllowPrivilegeEscalation {
			return fmt.Errorf("security context %+v", sc)
		}
		if len(p.Volumes) != 1 || p.Volumes[0].HostPath == nil || p.Volumes[0].HostPath.Path != "/dev/net/tun" ||
			*p.Volumes[0].HostPath.Type != corev1.HostPathCharDev || p.Containers[0].VolumeMounts[0].MountPath != "/dev/net/tun" {
			return fmt.Errorf("volumes %+v mounts %+v", p.Volumes, p.Containers[0].VolumeMounts)
		}
		return nil
	})
	waitReason(t, flow, "Ready")
	if c := waitReason(t, packet, "TUNNotAllowed"); strings.Contains(c.Message, "tun-hk") || !strings.Contains(c.Message, "tun-la") {
		t.Errorf("packet mode with only the entry allowed: %s", c.Message)
	}
	setTUN(la, true)
	waitReason(t, packet, "Ready")

	// Turned off again: the pods lose the privileges.
	setTUN(hk, false)
	eventually(t, "relay pods unprivileged again", func() error {
		p, err := podOf()
		if err != nil {
			return err
		}
		return unprivileged(p)
	})
	waitReason(t, flow, "TUNNotAllowed")
}

// A relay pod that runs but is not ready yet has its address published: the
// relay becomes ready only once its peers' RelayNodes, endpoints included,
// are valid, so publishing only ready relays deadlocked chains whose relays
// started together (seen in the kind e2e).
func TestEndpointsOfRunningRelayBeforeReady(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	rn := relayNode(ns, "la", func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = 7600 })
	create(t, rn)
	ds := &appsv1.DaemonSet{}
	eventually(t, "DaemonSet exists", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName("la")}, ds)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: RelayObjectName("la") + "-y", Labels: ds.Spec.Template.Labels},
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	create(t, pod)
	pod.Status = corev1.PodStatus{HostIP: "172.18.0.7", PodIP: "172.18.0.7", Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}}
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
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

// The operator, not the RelayNode, says which images run and where relays
// may take the host network or a TUN device: a user sees why in the
// RelayNode's Ready condition, and no DaemonSet runs until it is allowed.
func TestRelayNodeAdmissionRules(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t) + "-plain"
	mustCreateNamespaceWith(ctx, ns, nil)
	refused := func(rn *v1alpha1.RelayNode, reason string, says ...string) {
		t.Helper()
		eventually(t, rn.Name+" refused", func() error {
			c, err := readyCondition(rn)
			if err != nil {
				return err
			}
			if c.Status != metav1.ConditionFalse || c.Reason != reason {
				return fmt.Errorf("Ready %s %s: %s", c.Status, c.Reason, c.Message)
			}
			for _, s := range says {
				if !strings.Contains(c.Message, s) {
					return fmt.Errorf("message %q does not say %q", c.Message, s)
				}
			}
			return nil
		})
		var ds appsv1.DaemonSet
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(rn.Name)}, &ds); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a DaemonSet runs although the RelayNode is refused (%v)", rn.Name, err)
		}
	}

	host := relayNode(ns, "hostnet")
	create(t, host)
	refused(host, "PrivilegesNotAllowed", "spec.hostNetwork", "kubectl label namespace "+ns+" "+LabelPrivilegedRelays+"=true")
	tun := relayNode(ns, "tunrelay", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false); r.Spec.TUN = true })
	create(t, tun)
	refused(tun, "PrivilegesNotAllowed", "spec.tun", "NET_ADMIN")
	img := relayNode(ns, "ownimage", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false); r.Spec.Image = "evil.example/relay:1" })
	create(t, img)
	refused(img, "ImageNotAllowed", `spec.image "evil.example/relay:1"`, "hoplink:test", "allowed.example/hoplink:")

	// Allowed: pod network with the operator's image or an allowed one.
	for _, rn := range []*v1alpha1.RelayNode{
		relayNode(ns, "podnet", func(r *v1alpha1.RelayNode) { r.Spec.HostNetwork = ptr.To(false) }),
		relayNode(ns, "allowedimage", func(r *v1alpha1.RelayNode) {
			r.Spec.HostNetwork = ptr.To(false)
			r.Spec.Image = "allowed.example/hoplink:2"
		}),
	} {
		create(t, rn)
		eventually(t, rn.Name+"'s DaemonSet", func() error {
			var ds appsv1.DaemonSet
			return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(rn.Name)}, &ds)
		})
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
}
