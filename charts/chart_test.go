// Package charts holds the Helm chart; its tests lint and render the chart
// with helm (built from its Go module by hack/helm.sh) and apply what it
// renders to a real kube-apiserver (envtest) as a server-side dry run.
package charts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/metrics"
)

const chart = "hoplink"

// promOperator is where the PodMonitor and ServiceMonitor CRDs come from:
// the Prometheus Operator's Go module, which carries them.
const promOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

func helm(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../hack/helm.sh").Output()
	if err != nil {
		t.Fatalf("hack/helm.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func run(t *testing.T, argv ...string) ([]byte, error) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, errors.New(strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// The chart's CRDs are the generated ones, and its operator rules too.
func TestChartMatchesGeneratedManifests(t *testing.T) {
	pairs := map[string]string{filepath.Join(chart, "files", "operator-role.yaml"): filepath.Join("..", "config", "rbac", "role.yaml")}
	gen, err := filepath.Glob(filepath.Join("..", "config", "crd", "bases", "*.yaml"))
	if err != nil || len(gen) == 0 {
		t.Fatalf("no generated CRDs: %v", err)
	}
	for _, g := range gen {
		pairs[filepath.Join(chart, "files", "crds", filepath.Base(g))] = g
	}
	inChart, _ := filepath.Glob(filepath.Join(chart, "files", "crds", "*.yaml"))
	if len(inChart) != len(gen) {
		t.Errorf("the chart has %d CRDs, config/crd/bases %d: run make manifests", len(inChart), len(gen))
	}
	for c, g := range pairs {
		a, err1 := os.ReadFile(c)
		b, err2 := os.ReadFile(g)
		if err := errors.Join(err1, err2); err != nil {
			t.Error(err)
			continue
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run make manifests", c, g)
		}
	}
}

func TestLint(t *testing.T) {
	if out, err := run(t, helm(t), "lint", "--strict", chart); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

// Bad values fail at render time, naming the value.
func TestValuesRejected(t *testing.T) {
	h := helm(t)
	for _, tc := range []struct{ set, want string }{
		{"operator.replicas=0", "/operator/replicas"},
		{"operator.logFormat=xml", "/operator/logFormat"},
		{"relay.resources.requests.cpu=fast", "/relay/resources/requests/cpu"},
		{"ca.existingSecret=Not_A_Name", "/ca/existingSecret"},
		{"operator.replicas=2,operator.leaderElection=false", "operator.leaderElection"},
		{"operator.replica=2", "replica"},
		{"relay.privileged=everyone", "/relay/privileged"},
		{"relay.nodeEgress=everywhere", "/relay/nodeEgress"},
		{"operator.priorityClassName=Not_A_Class", "/operator/priorityClassName"},
		{"alerts.prometheusRule.for=soon", "/alerts/prometheusRule/for"},
		{"operator.watchNamespaces={edge}", "sidecar.injector.enabled: false"},
		{"operator.watchNamespaces={Not_A_Namespace},sidecar.injector.enabled=false", "/operator/watchNamespaces/0"},
		{"multicluster.enabled=true", "multicluster.gateway"},
		{"multicluster.enabled=true,multicluster.gateway=hk", "/multicluster/gateway"},
		{"multicluster.clusterID=Cluster_A", "/multicluster/clusterID"},
		{"multicluster.routeMode=fastest", "/multicluster/routeMode"},
		{"multicluster.enabled=true,multicluster.gateway=edge/hk,operator.watchNamespaces={edge},sidecar.injector.enabled=false", "cluster-wide install"},
		{"sidecar.injector.networkPolicy.enabled=true", "sidecar.injector.networkPolicy.from"},
		{"sidecar.injector.clientNames={kube-apiserver}", "sidecar.injector.clientCA.configMap"},
	} {
		_, err := run(t, h, "template", "t", chart, "--set", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: %v; want an error naming %s", tc.set, err, tc.want)
		}
	}
}

// The webhook the chart registers is the one the operator's tests register
// (inject.WebhookConfiguration), pointed at the Service the operator names
// in its serving certificate; turned off, nothing is registered or served.
func TestWebhookRegistrationMatchesTheOperator(t *testing.T) {
	h := helm(t)
	out, err := run(t, h, "template", "rel", chart, "--namespace", "hl-sys")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var hook *admissionregistrationv1.MutatingWebhookConfiguration
	var args []string
	for _, o := range decode(t, out) {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			hook = &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, hook); err != nil {
				t.Fatal(err)
			}
		case "Deployment":
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, a := range cs[0].(map[string]any)["args"].([]any) {
				args = append(args, a.(string))
			}
		}
	}
	if hook == nil {
		t.Fatal("no MutatingWebhookConfiguration rendered")
	}
	want := inject.WebhookConfiguration("hoplink-sidecar-injector", "hl-sys", "rel-hoplink-webhook")
	if hook.Name != want.Name || !equality.Semantic.DeepEqual(hook.Webhooks, want.Webhooks) {
		t.Errorf("chart registers\n%+v\nthe operator expects\n%+v", hook.Webhooks, want.Webhooks)
	}
	if !slices.Contains(args, "--webhook-service=rel-hoplink-webhook") || !slices.Contains(args, "--webhook-port=9443") {
		t.Errorf("operator args %v do not name the webhook Service and port", args)
	}

	// config/webhook, for kubectl apply -k config/default, is the same.
	raw, err := os.ReadFile(filepath.Join("..", "config", "webhook", "webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range decode(t, raw) {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		found = true
		var kust admissionregistrationv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &kust); err != nil {
			t.Fatal(err)
		}
		want := inject.WebhookConfiguration("hoplink-sidecar-injector", "hoplink-system", "hoplink-webhook")
		if kust.Name != want.Name || !equality.Semantic.DeepEqual(kust.Webhooks, want.Webhooks) {
			t.Errorf("config/webhook registers\n%+v\nthe operator expects\n%+v", kust.Webhooks, want.Webhooks)
		}
	}
	if !found {
		t.Error("config/webhook/webhook.yaml registers no webhook")
	}

	out, err = run(t, h, "template", "rel", chart, "--set", "sidecar.injector.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte("MutatingWebhookConfiguration")) || !bytes.Contains(out, []byte("--webhook-port=0")) {
		t.Error("with the injector off, the chart still registers or serves a webhook")
	}
}

// What the chart renders, with its defaults and with every option on, is
// accepted by a real API server.
func TestTemplateAppliesToAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run make test, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	h := helm(t)
	mod, err := exec.Command("go", "mod", "download", "-json", promOperator).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", promOperator, err)
	}
	var dl struct{ Dir string }
	if err := json.Unmarshal(mod, &dl); err != nil || dl.Dir == "" {
		t.Fatalf("go mod download %s: %v", promOperator, err)
	}
	crdDir := filepath.Join(dl.Dir, "example", "prometheus-operator-crd")
	_, c := apiServer(t,
		filepath.Join(crdDir, "monitoring.coreos.com_podmonitors.yaml"),
		filepath.Join(crdDir, "monitoring.coreos.com_servicemonitors.yaml"),
		filepath.Join(crdDir, "monitoring.coreos.com_prometheusrules.yaml"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name string
		args []string
		want []string // kinds that must be rendered
	}{
		{"defaults", nil, []string{"Deployment", "PodDisruptionBudget", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Service", "CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
		{"everything on", []string{"--set", "metrics.podMonitor.enabled=true,metrics.serviceMonitor.enabled=true,grafana.dashboard.enabled=true,ca.existingSecret=my-ca,operator.replicas=2,relay.image=relay:1,relay.allowedImages={reg.example/hoplink:},relay.privileged=any,relay.nodeEgress=any," +
			"alerts.prometheusRule.enabled=true,operator.podAnnotations.team=net,operator.podLabels.tier=infra,operator.priorityClassName=system-cluster-critical,operator.extraEnv[0].name=HTTPS_PROXY,operator.extraEnv[0].value=http://proxy:3128"},
			[]string{"PodMonitor", "ServiceMonitor", "ConfigMap", "Deployment", "PrometheusRule"}},
		{"no leader election", []string{"--set", "operator.leaderElection=false,operator.replicas=1"}, []string{"Deployment"}},
		{"namespace-scoped", []string{"--set", "operator.watchNamespaces={hl-namespace-scoped},sidecar.injector.enabled=false"}, []string{"Deployment", "Role", "RoleBinding"}},
		{"webhook callers", []string{"--set", "sidecar.injector.clientCA.configMap=kube-root-ca.crt,sidecar.injector.clientNames={kube-apiserver-webhook-client}," +
			"sidecar.injector.networkPolicy.enabled=true,sidecar.injector.networkPolicy.from[0].ipBlock.cidr=172.18.0.0/16"}, []string{"Deployment", "NetworkPolicy", "MutatingWebhookConfiguration"}},
		{"multicluster", []string{"--set", "multicluster.enabled=true,multicluster.clusterID=east,multicluster.gateway=edge/hk,multicluster.coreDNS.configure=true,multicluster.coreDNS.namespace=hl-multicluster"},
			[]string{"Deployment", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "hl-" + strings.ReplaceAll(tc.name, " ", "-")
			args := append([]string{"template", "rel", chart, "--namespace", ns, "--include-crds"}, tc.args...)
			out, err := run(t, append([]string{h}, args...)...)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			objs := decode(t, out)
			seen := map[string]bool{}
			for _, o := range objs {
				seen[o.GetKind()] = true
			}
			for _, k := range tc.want {
				if !seen[k] {
					t.Errorf("no %s rendered", k)
				}
			}
			if strings.Contains(strings.Join(tc.args, " "), "watchNamespaces") && (seen["ClusterRole"] || seen["ClusterRoleBinding"] || seen["MutatingWebhookConfiguration"] || seen["ValidatingAdmissionPolicy"]) {
				t.Error("a namespace-scoped install renders cluster-wide RBAC, the webhook or the Tunnel limits policy")
			}
			nsObj := &unstructured.Unstructured{}
			nsObj.SetAPIVersion("v1")
			nsObj.SetKind("Namespace")
			nsObj.SetName(ns)
			if err := c.Create(ctx, nsObj); err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				opts := []client.PatchOption{client.FieldOwner("chart-test"), client.ForceOwnership}
				// CRDs for real (as helm installs them first), the rest as
				// a dry run.
				if o.GetKind() != "CustomResourceDefinition" {
					opts = append(opts, client.DryRunAll)
				}
				if err := c.Patch(ctx, o, client.Apply, opts...); err != nil {
					t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		})
	}
}

// apiServer starts a kube-apiserver and etcd (envtest) with the CRDs of
// crds installed, stopped when the test ends, and a client of it.
func apiServer(t *testing.T, crds ...string) (*rest.Config, client.Client) {
	t.Helper()
	env := &envtest.Environment{CRDInstallOptions: envtest.CRDInstallOptions{Paths: crds}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	clientgoscheme.AddToScheme(s)
	apiextensionsv1.AddToScheme(s)
	return s
}

func decode(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("rendered YAML: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// helm upgrade updates the CRDs (they are templates, not crds/ files, which
// Helm installs once and never again), keeps them on uninstall by default,
// and crds.install=false renders none.
func TestHelmUpgradeUpdatesCRDs(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run make test, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	h := helm(t)
	if out, err := run(t, h, "template", "rel", chart, "--set", "crds.install=false"); err != nil || bytes.Contains(out, []byte("kind: CustomResourceDefinition")) {
		t.Errorf("crds.install=false still renders CRDs (%v)", err)
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	user, err := env.AddUser(envtest.User{Name: "helm", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	apiextensionsv1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	helmRun := func(args ...string) {
		t.Helper()
		args = append(args, "--namespace", "hl-upgrade", "--kubeconfig", kubeconfig)
		if args[0] != "uninstall" {
			args = append(args, "--set", "sidecar.injector.enabled=false")
		}
		if out, err := run(t, append([]string{h}, args...)...); err != nil {
			t.Fatalf("helm %s: %v\n%s", args[0], err, out)
		}
	}
	description := func() string {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(context.Background(), client.ObjectKey{Name: "tunnels.hoplink.dev"}, &crd); err != nil {
			t.Fatal(err)
		}
		if crd.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("the CRD is not kept on uninstall: %v", crd.Annotations)
		}
		return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["proxyProtocol"].Description
	}

	helmRun("install", "rel", chart, "--create-namespace")
	if d := description(); strings.Contains(d, "UPGRADED") {
		t.Fatalf("before the upgrade: %q", d)
	}
	// The next version of the chart changes a CRD.
	next := filepath.Join(dir, chart)
	if out, err := exec.Command("cp", "-r", chart, next).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	crdFile := filepath.Join(next, "files", "crds", "hoplink.dev_tunnels.yaml")
	b, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	changed := bytes.Replace(b, []byte("ProxyProtocol makes the exit"), []byte("UPGRADED ProxyProtocol makes the exit"), 1)
	if bytes.Equal(b, changed) {
		t.Fatal("the CRD has no proxyProtocol description to change")
	}
	if err := os.WriteFile(crdFile, changed, 0o644); err != nil {
		t.Fatal(err)
	}
	helmRun("upgrade", "rel", next)
	if d := description(); !strings.Contains(d, "UPGRADED") {
		t.Errorf("helm upgrade left the CRD as it was: %q", d)
	}
	helmRun("uninstall", "rel")
	description() // still there
}

// The PrometheusRule's alerts are valid rules (promtool, from the Debian
// prometheus package CI installs) over metrics hoplink exports.
func TestAlertsAreValidRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("no promtool: apt-get install prometheus (.ci/run does)")
	}
	out, err := run(t, helm(t), "template", "rel", chart, "--set", "alerts.prometheusRule.enabled=true,alerts.prometheusRule.for=10m", "--show-only", "templates/alerts.yaml")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	objs := decode(t, out)
	if len(objs) != 1 || objs[0].GetKind() != "PrometheusRule" {
		t.Fatalf("rendered %d objects, want one PrometheusRule", len(objs))
	}
	groups, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "groups")
	rules, err := json.Marshal(map[string]any{"groups": groups}) // JSON is YAML
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, promtool, "check", "rules", file); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}

	exported := map[string]bool{}
	reg := describer(exported)
	metrics.New(reg)
	metrics.NewRoute(reg)
	names := regexp.MustCompile(`hoplink_[a-z_]+`)
	alerts := 0
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			alerts++
			expr, _, _ := unstructured.NestedString(r.(map[string]any), "expr")
			for _, n := range names.FindAllString(expr, -1) {
				if !exported[n] {
					t.Errorf("alert %v uses %s, which hoplink does not export", r.(map[string]any)["alert"], n)
				}
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts, want relay, peer, route, certificate and drop alerts", alerts)
	}
}

// describer is a Registerer that records the names of what registers.
type describer map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d[m[1]] = true
		}
	}
	return nil
}

func (d describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		d.Register(c)
	}
}

func (d describer) Unregister(prometheus.Collector) bool { return false }

// What helm prints after an install is where a new user meets the chart
// first: with the default policy, its next steps label the namespace that
// the samples' host-network relays need, and say what happens without the
// label; where no label is needed, they do not ask for one.
func TestNotesNameTheNamespaceLabel(t *testing.T) {
	h := helm(t)
	const label = "kubectl label namespace edge hoplink.dev/privileged-relays=true"
	for _, tc := range []struct {
		set  []string
		want bool
	}{
		{nil, true},
		{[]string{"--set", "relay.privileged=any"}, false},
		{[]string{"--set", "operator.watchNamespaces={edge}", "--set", "sidecar.injector.enabled=false"}, false},
	} {
		out, err := run(t, append([]string{h, "install", "--dry-run=client", "hoplink", chart, "-n", "hoplink-system"}, tc.set...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.set, err)
		}
		_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
		if !ok {
			t.Fatalf("%v: no NOTES in\n%s", tc.set, out)
		}
		label, refused := strings.Contains(notes, label), strings.Contains(notes, "PrivilegesNotAllowed")
		if label != tc.want || refused != tc.want {
			t.Errorf("%v: NOTES name the label %v, the refusal %v; want %v:\n%s", tc.set, label, refused, tc.want, notes)
		}
	}
}

// The operator's pod meets the restricted Pod Security Standard where it
// is the operator's to say: non-root, no privilege escalation, no
// capabilities, and the runtime's default seccomp profile (without one the
// container runs unconfined wherever the kubelet does not default it).
// Both the chart's and config/manager's. (Relays' containers: inject.RelaySecurityContext, tested in inject and controllers.)
func TestOperatorPodIsRestricted(t *testing.T) {
	out, err := run(t, helm(t), "template", "rel", chart, "--namespace", "hl-sys")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join("..", "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for src, doc := range map[string][]byte{"chart": out, "config/manager": raw} {
		n := 0
		for _, o := range decode(t, doc) {
			if o.GetKind() != "Deployment" {
				continue
			}
			n++
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			pod := d.Spec.Template.Spec
			for _, c := range append(pod.InitContainers, pod.Containers...) {
				var problems []string
				sc := c.SecurityContext
				if sc == nil {
					sc = &corev1.SecurityContext{}
				}
				seccomp := sc.SeccompProfile
				if seccomp == nil && pod.SecurityContext != nil {
					seccomp = pod.SecurityContext.SeccompProfile
				}
				if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
					problems = append(problems, "no RuntimeDefault seccomp profile")
				}
				nonRoot := sc.RunAsNonRoot
				if nonRoot == nil && pod.SecurityContext != nil {
					nonRoot = pod.SecurityContext.RunAsNonRoot
				}
				if nonRoot == nil || !*nonRoot {
					problems = append(problems, "may run as root")
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					problems = append(problems, "may escalate privileges")
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
					problems = append(problems, "keeps capabilities")
				}
				if len(problems) > 0 {
					t.Errorf("%s: %s container %s: %s", src, d.Name, c.Name, strings.Join(problems, ", "))
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no Deployment", src)
		}
	}
}

// image.digest pins the operator's image, which relay pods run too (the
// operator's own image is their default): REPOSITORY@DIGEST in the
// Deployment, a malformed digest refused, and the install notes say when
// the image is not registry-qualified or not pinned.
func TestImagePinnedByDigest(t *testing.T) {
	h := helm(t)
	digest := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	image := func(set ...string) string {
		t.Helper()
		out, err := run(t, append([]string{h, "template", "rel", chart, "--show-only", "templates/deployment.yaml"}, set...)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decode(t, out) {
			if o.GetKind() == "Deployment" {
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				return cs[0].(map[string]any)["image"].(string)
			}
		}
		t.Fatal("no Deployment")
		return ""
	}
	if got := image("--set", "image.repository=registry.example.com/hl/hoplink,image.tag=1.2.3,image.digest="+digest); got != "registry.example.com/hl/hoplink@"+digest {
		t.Errorf("pinned image %q", got)
	}
	if got := image("--set", "image.tag=dev"); got != "hoplink:dev" {
		t.Errorf("unpinned image %q: kind clusters load hoplink:TAG", got)
	}
	if _, err := run(t, h, "template", "rel", chart, "--set", "image.digest=sha256:abc"); err == nil || !strings.Contains(err.Error(), "/image/digest") {
		t.Errorf("a malformed digest: %v", err)
	}
	notes := func(set string) string {
		out, err := run(t, h, "install", "--dry-run=client", "rel", chart, "-n", "hoplink-system", "--set", set)
		if err != nil {
			t.Fatal(err)
		}
		_, n, _ := strings.Cut(string(out), "\nNOTES:\n")
		return n
	}
	for set, want := range map[string]string{
		"image.tag=dev": "not registry-qualified and not pinned by digest",
		"image.repository=registry.example.com/hl/hoplink":                        "is not pinned by digest",
		"image.repository=myorg/hoplink,image.digest=" + digest:                   "is not registry-qualified:",
		"image.repository=localhost:5000/hoplink,image.digest=" + digest:          "",
		"image.repository=registry.example.com/hl/hoplink,image.digest=" + digest: "",
	} {
		n := notes(set)
		if want == "" && strings.Contains(n, "The image") || want != "" && !strings.Contains(n, want) {
			t.Errorf("--set %s: notes say\n%s\nwant %q", set, n, want)
		}
	}
}

// What the alerts tell on-call to do is what the docs say: the command
// that renews a standalone relay's certificate (not 'cert issue' and a
// SIGHUP: renewed files apply without one), and for a metric's reasons
// the doc whose metrics table lists them.
func TestAlertTextsMatchDocs(t *testing.T) {
	out, err := run(t, helm(t), "template", "rel", chart, "--set", "alerts.prometheusRule.enabled=true", "--show-only", "templates/alerts.yaml")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	objs := decode(t, out)
	groups, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "groups")
	docs := regexp.MustCompile(`docs/[a-z-]+\.md`)
	metric := regexp.MustCompile(`hoplink_[a-z_]+`)
	texts := map[string]string{}
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			name, _, _ := unstructured.NestedString(r.(map[string]any), "alert")
			summary, _, _ := unstructured.NestedString(r.(map[string]any), "annotations", "summary")
			desc, _, _ := unstructured.NestedString(r.(map[string]any), "annotations", "description")
			texts[name] = summary + " " + desc
			for _, d := range docs.FindAllString(desc, -1) {
				b, err := os.ReadFile(filepath.Join("..", d))
				if err != nil {
					t.Errorf("%s names %s: %v", name, d, err)
					continue
				}
				// A metric named beside the doc is one its table lists.
				for _, m := range metric.FindAllString(desc, -1) {
					if !strings.Contains(string(b), "| `"+m+"` |") {
						t.Errorf("%s sends readers to %s for %s, whose metrics table does not list it", name, d, m)
					}
				}
			}
		}
	}
	arch, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	renew := regexp.MustCompile("`(hoplink cert [a-z]+) --certs DIR` issues again").FindSubmatch(arch)
	if renew == nil {
		t.Fatal("docs/architecture.md no longer says which command renews standalone certificates")
	}
	cert := texts["HoplinkCertificateExpiring"]
	if !strings.Contains(cert, string(renew[1])) {
		t.Errorf("HoplinkCertificateExpiring does not name %s, which the docs renew with: %q", renew[1], cert)
	}
	for _, wrong := range []string{"cert issue", "SIGHUP"} {
		if strings.Contains(cert, wrong) {
			t.Errorf("HoplinkCertificateExpiring says %s; the docs renew with %s, applied without a signal: %q", wrong, renew[1], cert)
		}
	}
}
