package controllers

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/pki"
)

// The suite runs a real kube-apiserver and etcd (hack/setup-envtest.sh builds
// them; `make test` sets KUBEBUILDER_ASSETS) with the CRDs from
// config/crd/bases, and the operator's manager against them.
var (
	cfg    *rest.Config
	k8s    client.Client
	testCA = types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}

	testWebhookSecret = types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-webhook-cert"}
	suiteStop         context.CancelFunc

	suiteOnce sync.Once
	suiteErr  error
	suiteDone func()
)

const (
	testWebhookConfig = "hoplink-sidecar-injector"
	testVersion       = "v0.0.0-test"
)

// TestMain stops the API server that needAPI started, if a test did; pure
// tests (helpers, builders of child objects) run without one.
func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel())))
	code := m.Run()
	if suiteDone != nil {
		suiteDone()
	}
	os.Exit(code)
}

// needAPI starts the suite's API server and the operator on it, once, for
// the tests that need them.
func needAPI(t testing.TB) {
	t.Helper()
	suiteOnce.Do(func() { suiteErr = startSuite() })
	if suiteErr != nil {
		t.Fatal(suiteErr)
	}
}

func startSuite() error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	// The injection webhook as the chart registers it, pointed at this
	// process: envtest turns the Service into a local URL (adding its own
	// "/"), and the operator then replaces envtest's caBundle with its own.
	hook := inject.WebhookConfiguration(testWebhookConfig, testCA.Namespace, "hoplink-webhook")
	hook.Webhooks[0].ClientConfig.Service.Path = ptr.To(strings.TrimPrefix(inject.Path, "/"))
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{hook},
		},
	}
	// The API server presents a client certificate to webhooks, as its
	// admission configuration tells it, and the operator takes no other
	// caller.
	admissionConfig, clientCA, err := webhookClientCerts()
	if err != nil {
		return err
	}
	env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admissionConfig)
	if cfg, err = env.Start(); err != nil {
		return fmt.Errorf("start envtest: %w", err)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
		env.Stop()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	suiteStop = cancel
	mustCreateNamespace(ctx, testCA.Namespace)
	wh := &env.WebhookInstallOptions
	// The operator's requests go through apiRequests, which tests read.
	mcfg := rest.CopyConfig(cfg)
	mcfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return apiRequests.wrap(rt) })
	mgr, err := NewManager(ctx, mcfg, Options{
		Image: "hoplink:test", AllowedRelayImages: []string{"allowed.example/hoplink:"}, CASecret: testCA, CreateCA: true,
		MetricsAddr: "0", ProbeAddr: "0", Version: testVersion,
		// Tests that wait for a Chain or Tunnel to say it is not ready
		// need not wait the default 10 s (firststatus_test.go checks the
		// wait itself).
		FirstStatusWait: 500 * time.Millisecond,
		Webhook: WebhookOptions{Port: wh.LocalServingPort, Host: wh.LocalServingHost, Hosts: []string{wh.LocalServingHost},
			Secret: testWebhookSecret, Config: testWebhookConfig, ClientCA: clientCA, ClientNames: []string{testAPIServerClient}},
	})
	if err != nil {
		cancel()
		env.Stop()
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			panic(err)
		}
	}()
	// Pods created before the webhook answers would fail (it fails closed).
	// Dialed, not asked of the manager: asking it for its webhook server
	// would start one that NewManager forgot to.
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cancel()
			env.Stop()
			return fmt.Errorf("webhook server did not start: %w", err)
		}
	}
	webhookAddr = addr
	suiteDone = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
		}
		env.Stop()
	}
	return nil
}

// testAPIServerClient is the name in the API server's client certificate
// for webhooks, signed by webhookClientCA.
const testAPIServerClient = "kube-apiserver-webhook-client"

var (
	// webhookClientCA signs what the API server presents to webhooks.
	webhookClientCA *pki.CA
	// webhookAddr is where the operator serves the webhook.
	webhookAddr string
	// apiRequests records the operator's requests to the API server.
	apiRequests requestLog
)

// webhookClientCerts writes the API server's admission configuration,
// which gives it a client certificate for every webhook, and the CA file
// the operator checks it with.
func webhookClientCerts() (admissionConfig, caFile string, err error) {
	dir, err := os.MkdirTemp("", "hoplink-admission")
	if err != nil {
		return "", "", err
	}
	if webhookClientCA, err = pki.NewCA("webhook client CA"); err != nil {
		return "", "", err
	}
	certPEM, keyPEM, err := webhookClientCA.Issue(testAPIServerClient)
	if err != nil {
		return "", "", err
	}
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nusers:\n- name: \"*\"\n  user:\n    client-certificate-data: %s\n    client-key-data: %s\n",
		base64.StdEncoding.EncodeToString(certPEM), base64.StdEncoding.EncodeToString(keyPEM))
	admission := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, filepath.Join(dir, "kubeconfig"))
	for name, b := range map[string][]byte{"kubeconfig": []byte(kubeconfig), "admission.yaml": []byte(admission), "ca.crt": webhookClientCA.PEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", "", err
		}
	}
	return filepath.Join(dir, "admission.yaml"), filepath.Join(dir, "ca.crt"), nil
}

// requestLog records requests: their method, path and user agent.
type requestLog struct {
	mu   sync.Mutex
	reqs []loggedRequest
}

type loggedRequest struct{ method, path, query, agent string }

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		if len(l.reqs) < 1<<20 {
			l.reqs = append(l.reqs, loggedRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.UserAgent()})
		}
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// since returns the requests after the first n, and how many there are.
func (l *requestLog) since(n int) ([]loggedRequest, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs[min(n, len(l.reqs)):]), len(l.reqs)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func zapLevel() zapcore.Level {
	if os.Getenv("HOPLINK_TEST_LOG") != "" {
		return -1
	}
	return 2 // errors only: envtest suites are chatty
}

// Fixtures shared by the envtest tests of every reconciler.

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

// external is a RelayNode that runs elsewhere, reached at endpoint: the
// operator issues its certificate and runs nothing for it.
func external(endpoint string) func(*v1alpha1.RelayNode) {
	return func(r *v1alpha1.RelayNode) { r.Spec.External = true; r.Spec.Endpoints = []string{endpoint} }
}

// listenPort is a RelayNode listening on port.
func listenPort(port int32) func(*v1alpha1.RelayNode) {
	return func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = port }
}

// relayPod stands in for the DaemonSet controller and kubelet, which
// envtest does not run: once the RelayNode's DaemonSet exists, it creates
// a pod of it in the given state, and returns the DaemonSet.
func relayPod(t *testing.T, rn *v1alpha1.RelayNode, status corev1.PodStatus) *appsv1.DaemonSet {
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
	pod.Status = status
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return ds
}

// runRelayPod reports one scheduled, ready relay pod on a node.
func runRelayPod(t *testing.T, rn *v1alpha1.RelayNode, hostIP string) {
	t.Helper()
	ds := relayPod(t, rn, corev1.PodStatus{HostIP: hostIP, PodIP: "10.244.0.9", Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}})
	ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
	if err := k8s.Status().Update(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
}

// relayNodes creates RelayNodes of these names, the first listening on
// port and each next one 10 above, without pods.
func relayNodes(t *testing.T, ns string, port int32, names ...string) []*v1alpha1.RelayNode {
	t.Helper()
	var rns []*v1alpha1.RelayNode
	for i, name := range names {
		rn := relayNode(ns, name, listenPort(port+int32(10*i)))
		create(t, rn)
		rns = append(rns, rn)
	}
	return rns
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

// chainLatency is the route controller's last figure of a kind
// (estimated or measured) for a chain, 0 when it has none.
func chainLatency(t *testing.T, chain, kind string) time.Duration {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "hoplink_chain_latency_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["chain"] == chain && labels["kind"] == kind {
				return time.Duration(m.GetGauge().GetValue() * float64(time.Second))
			}
		}
	}
	return 0
}
