package controllers

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
)

func sidecarRelay(ns, name string, mutate ...func(*v1alpha1.RelayNode)) *v1alpha1.RelayNode {
	return relayNode(ns, name, append([]func(*v1alpha1.RelayNode){func(rn *v1alpha1.RelayNode) { rn.Spec.Sidecar = &v1alpha1.RelaySidecar{} }}, mutate...)...)
}

// appPod is a workload pod that passes the restricted Pod Security profile.
func appPod(ns, name, relay string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelRelayNode: relay, "app": "web"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "web",
			Containers: []corev1.Container{{Name: "app", Image: "app:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				}}},
		},
	}
}

// warningClient creates pods and writes the API server's warnings to w.
func warningClient(t *testing.T, w *bytes.Buffer) *kubernetes.Clientset {
	c := rest.CopyConfig(cfg)
	c.WarningHandler = rest.NewWarningWriter(w, rest.WarningWriterOptions{})
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestSidecarInjection goes through the real API server: the webhook as the
// chart registers it, served with the operator's own certificate.
func TestSidecarInjection(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	create(t, sidecarRelay(ns, "web"))
	create(t, relayNode(ns, "node-relay"))

	pod := appPod(ns, "web-1", "web")
	create(t, pod)
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != inject.ContainerName {
		t.Fatalf("pod was not injected: init containers %v", pod.Spec.InitContainers)
	}
	sc := pod.Spec.InitContainers[0]
	if *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways || sc.Image != "hoplink:test" {
		t.Errorf("sidecar %+v", sc)
	}
	if pod.Annotations[inject.AnnotationVersion] != testVersion {
		t.Errorf("annotations %v", pod.Annotations)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != "app" || pod.Spec.Containers[0].Ports[0].ContainerPort != 8080 {
		t.Errorf("the app container changed: %+v", pod.Spec.Containers)
	}

	t.Run("denials name the fix", func(t *testing.T) {
		for _, c := range []struct {
			pod  *corev1.Pod
			want string
		}{
			{appPod(ns, "nobody", "nobody"), "names no RelayNode in namespace " + ns + ": create RelayNode \"nobody\" with spec.sidecar"},
			{appPod(ns, "daemonset-mode", "node-relay"), "is not in sidecar mode"},
			{func() *corev1.Pod { p := appPod(ns, "hostnet", "web"); p.Spec.HostNetwork = true; return p }(), "remove spec.hostNetwork"},
		} {
			err := k8s.Create(ctx, c.pod)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("pod %s: error %v, want one containing %q", c.pod.Name, err, c.want)
			}
		}
	})

	t.Run("the operator's relay pods are never injected", func(t *testing.T) {
		p := appPod(ns, "relay-pod", "node-relay")
		p.Labels = relayLabels("node-relay")
		create(t, p)
		if len(p.Spec.InitContainers) != 0 {
			t.Errorf("a relay DaemonSet pod got %v", p.Spec.InitContainers)
		}
	})

	t.Run("unlabelled pods are not sent to the webhook", func(t *testing.T) {
		p := appPod(ns, "plain", "x")
		delete(p.Labels, LabelRelayNode)
		create(t, p)
		if len(p.Spec.InitContainers) != 0 {
			t.Errorf("got %v", p.Spec.InitContainers)
		}
	})

	t.Run("port clashes are warned about", func(t *testing.T) {
		p := appPod(ns, "clash", "web")
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: v1alpha1.DefaultRelayPort}}
		var warnings bytes.Buffer
		wc := warningClient(t, &warnings)
		if _, err := wc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(warnings.String(), "clashes with the hoplink relay's tls port") {
			t.Errorf("warnings %q", warnings.String())
		}
	})

	t.Run("restricted namespaces take sidecars but refuse TUN ones", func(t *testing.T) {
		rns := namespace(t)
		var n corev1.Namespace
		if err := k8s.Get(ctx, types.NamespacedName{Name: rns}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		if err := k8s.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
		create(t, sidecarRelay(rns, "plain"))
		create(t, relayNode(rns, "tun", func(rn *v1alpha1.RelayNode) { rn.Spec.Sidecar, rn.Spec.TUN = &v1alpha1.RelaySidecar{}, true }))
		// Pod Security admission runs after the webhook: the injected pod
		// passing it shows the sidecar is restricted-compliant.
		if err := k8s.Create(ctx, appPod(rns, "ok", "plain")); err != nil {
			t.Errorf("restricted namespace refused a plain sidecar: %v", err)
		}
		err := k8s.Create(ctx, appPod(rns, "tun", "tun"))
		if err == nil || !strings.Contains(err.Error(), "its sidecar needs NET_ADMIN, root and /dev/net/tun, which namespace "+rns+" forbids") {
			t.Errorf("TUN sidecar in a restricted namespace: %v", err)
		}
	})

	t.Run("the caBundle is the operator's CA", func(t *testing.T) {
		var cfg admissionregistrationv1.MutatingWebhookConfiguration
		var sec corev1.Secret
		if err := k8s.Get(ctx, types.NamespacedName{Name: testWebhookConfig}, &cfg); err != nil {
			t.Fatal(err)
		}
		if err := k8s.Get(ctx, testWebhookSecret, &sec); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cfg.Webhooks[0].ClientConfig.CABundle, sec.Data["ca.crt"]) {
			t.Error("caBundle is not the CA in the webhook's Secret")
		}
	})

	t.Run("the RelayNode gets a headless Service, RBAC for its pods, no DaemonSet, and counts", func(t *testing.T) {
		key := types.NamespacedName{Namespace: ns, Name: RelayObjectName("web")}
		eventually(t, "Service, RoleBinding and status", func() error {
			var svc corev1.Service
			if err := k8s.Get(ctx, key, &svc); err != nil {
				return err
			}
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Selector[LabelRelayNode] != "web" {
				return fmt.Errorf("service %+v", svc.Spec)
			}
			// Slices of both families where the cluster has them (this
			// API server has one): peers dial a pod on either.
			if p := svc.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicyPreferDualStack {
				return fmt.Errorf("service's family policy %v, want PreferDualStack", p)
			}
			var rb rbacv1.RoleBinding
			if err := k8s.Get(ctx, key, &rb); err != nil {
				return err
			}
			if len(rb.Subjects) != 1 || rb.Subjects[0].Name != "web" {
				return fmt.Errorf("subjects %+v, want the pods' service account web", rb.Subjects)
			}
			rn := &v1alpha1.RelayNode{}
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "web"}, rn); err != nil {
				return err
			}
			if rn.Status.Injected < 1 || rn.Status.Outdated != 0 {
				return fmt.Errorf("status %+v", rn.Status)
			}
			return nil
		})
		err := k8s.Get(ctx, key, &appsv1.DaemonSet{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("a sidecar RelayNode has a DaemonSet: %v", err)
		}
		waitReason(t, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}, "SidecarsNotReady")
	})
}

// The webhook's serving certificate: made once, its leaf reissued (same CA)
// when it nears expiry or misses a host, and replicas racing to make it
// agree on one.
func TestWebhookServingCertificate(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	key := types.NamespacedName{Namespace: ns, Name: "hook-cert"}
	keeper := func(hosts []string, validity time.Duration) *inject.ServingCert {
		return &inject.ServingCert{Client: k8s, Secret: key, Hosts: hosts, Validity: validity}
	}
	read := func() (ca, leaf []byte) {
		var s corev1.Secret
		if err := k8s.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		return s.Data["ca.crt"], s.Data["tls.crt"]
	}

	// Two replicas at once: one Secret, one CA, both serve its leaf.
	a, b := keeper([]string{"hook.svc"}, 0), keeper([]string{"hook.svc"}, 0)
	errs := make(chan error, 2)
	go func() { errs <- a.Ensure(ctx) }()
	go func() { errs <- b.Ensure(ctx) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ca, leaf := read()
	ca1, _ := a.GetCertificate(nil)
	ca2, _ := b.GetCertificate(nil)
	if !bytes.Equal(ca1.Certificate[0], ca2.Certificate[0]) {
		t.Error("two replicas serve different certificates")
	}

	// Nothing to do: nothing changes.
	if err := keeper([]string{"hook.svc"}, 0).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if c, l := read(); !bytes.Equal(c, ca) || !bytes.Equal(l, leaf) {
		t.Error("a current certificate was reissued")
	}
	// A new host, then a leaf with less than a third of its validity left
	// (a keeper that issues for three years sees a 90-day leaf so): a new
	// leaf from the same CA, so the caBundle stays valid.
	for _, k := range []*inject.ServingCert{keeper([]string{"hook.svc", "hook.ns.svc"}, 0), keeper([]string{"hook.svc", "hook.ns.svc"}, 3*365*24*time.Hour)} {
		if err := k.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		c, l := read()
		if !bytes.Equal(c, ca) || bytes.Equal(l, leaf) {
			t.Errorf("want a new leaf under the same CA (CA same: %v, leaf same: %v)", bytes.Equal(c, ca), bytes.Equal(l, leaf))
		}
		leaf = l
	}
}

// One relay policy for every RelayNode form: a sidecar RelayNode whose
// image the operator does not run, or whose TUN device its namespace does
// not allow, is refused in its Ready condition, and the webhook injects no
// pod with it (before, both ran: any image, and root with NET_ADMIN in
// any namespace). Once the namespace opts in, the TUN sidecar is injected.
func TestSidecarRelayPolicy(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t) + "-plain"
	mustCreateNamespaceWith(ctx, ns, nil)
	evil := sidecarRelay(ns, "policy-evil", func(rn *v1alpha1.RelayNode) { rn.Spec.Image = "evil.example/relay:1" })
	tun := sidecarRelay(ns, "policy-tun", func(rn *v1alpha1.RelayNode) { rn.Spec.TUN = true })
	allowed := sidecarRelay(ns, "policy-allowed", func(rn *v1alpha1.RelayNode) { rn.Spec.Image = "allowed.example/hoplink:2" })
	for _, rn := range []*v1alpha1.RelayNode{evil, tun, allowed} {
		create(t, rn)
	}
	for _, tc := range []struct {
		rn     *v1alpha1.RelayNode
		reason string
		says   string
	}{
		{evil, ReasonImageNotAllowed, `spec.image "evil.example/relay:1"`},
		{tun, ReasonPrivilegesNotAllowed, "spec.tun runs the sidecar relay of every pod it is injected into as root with NET_ADMIN"},
	} {
		c := waitReason(t, tc.rn, tc.reason)
		if !strings.Contains(c.Message, tc.says) {
			t.Errorf("%s: condition %q does not say %q", tc.rn.Name, c.Message, tc.says)
		}
		err := k8s.Create(ctx, appPod(ns, tc.rn.Name+"-1", tc.rn.Name))
		if err == nil || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("pod of %s: error %v, want a denial that says %s and %q", tc.rn.Name, err, tc.reason, tc.says)
		}
		// Nothing that lets a relay of its read the namespace or be found.
		key := types.NamespacedName{Namespace: ns, Name: RelayObjectName(tc.rn.Name)}
		for _, o := range []client.Object{&rbacv1.RoleBinding{}, &corev1.Service{}} {
			if err := k8s.Get(ctx, key, o); !apierrors.IsNotFound(err) {
				t.Errorf("%s: %T exists although its RelayNode is refused (%v)", tc.rn.Name, o, err)
			}
		}
	}
	p := appPod(ns, "allowed-1", "policy-allowed")
	create(t, p)
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != "allowed.example/hoplink:2" {
		t.Fatalf("an allowed image was not injected: %+v", p.Spec.InitContainers)
	}

	var nsObj corev1.Namespace
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns}, &nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = map[string]string{LabelPrivilegedRelays: "true"}
	if err := k8s.Update(ctx, &nsObj); err != nil {
		t.Fatal(err)
	}
	// The webhook reads the namespace from the manager's cache at each
	// admission, so the label takes effect once the watch delivers it
	// (milliseconds; a create in the meantime is still refused). The
	// condition follows at the RelayNode's next reconcile (the new pod's).
	eventually(t, "a TUN pod admitted once its namespace opted in", func() error {
		p = appPod(ns, "tun-2", "policy-tun")
		return k8s.Create(ctx, p)
	})
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].SecurityContext.Capabilities.Add[0] != "NET_ADMIN" {
		t.Fatalf("the TUN sidecar was not injected once the namespace opted in: %+v", p.Spec.InitContainers)
	}
	waitReason(t, tun, ReasonSidecarsNotReady)
}
