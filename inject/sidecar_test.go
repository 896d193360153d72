package inject

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"

	jsonpatch5 "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

func sidecarNode(name string) *v1alpha1.RelayNode {
	return &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
		Spec: v1alpha1.RelayNodeSpec{Sidecar: &v1alpha1.RelaySidecar{}}}
}

// apply runs the patch over the pod's JSON, extra fields included, as the
// API server does.
func apply(t *testing.T, podJSON string, pod *corev1.Pod, rn *v1alpha1.RelayNode) (map[string]any, []string) {
	t.Helper()
	ops, warnings := Patch(pod, rn, Config{Image: "hoplink:v1", Version: "v1"})
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch5.DecodePatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply([]byte(podJSON))
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", raw, err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m, warnings
}

func TestPatch(t *testing.T) {
	cases := []struct {
		name, pod string
		initNames []string // init containers after injection
		volumes   int
	}{
		{"bare", `{"metadata":{"name":"a","labels":{"hoplink.dev/relaynode":"web"}},"spec":{"containers":[{"name":"app","image":"app"}]}}`,
			[]string{ContainerName}, 2},
		{"with init containers, volumes and annotations",
			`{"metadata":{"name":"a","annotations":{"x":"y"}},"spec":{"initContainers":[{"name":"setup","image":"s"}],"containers":[{"name":"app","image":"app"}],"volumes":[{"name":"data","emptyDir":{}}]}}`,
			[]string{ContainerName, "setup"}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var pod corev1.Pod
			if err := json.Unmarshal([]byte(c.pod), &pod); err != nil {
				t.Fatal(err)
			}
			// A field this operator's types do not know must survive.
			podJSON := strings.Replace(c.pod, `"spec":{`, `"spec":{"futureField":{"keep":true},`, 1)
			m, _ := apply(t, podJSON, &pod, sidecarNode("web"))
			spec := m["spec"].(map[string]any)
			if spec["futureField"] == nil {
				t.Errorf("the patch lost a field unknown to the operator: %v", spec)
			}
			var got []string
			for _, c := range spec["initContainers"].([]any) {
				got = append(got, c.(map[string]any)["name"].(string))
			}
			if strings.Join(got, ",") != strings.Join(c.initNames, ",") {
				t.Errorf("init containers %v, want %v (the relay first)", got, c.initNames)
			}
			if n := len(spec["volumes"].([]any)); n != c.volumes {
				t.Errorf("%d volumes, want %d", n, c.volumes)
			}
			ann := m["metadata"].(map[string]any)["annotations"].(map[string]any)
			if ann[AnnotationVersion] != "v1" {
				t.Errorf("annotations %v lack %s=v1", ann, AnnotationVersion)
			}
			// Injecting the result again changes nothing.
			var again corev1.Pod
			b, _ := json.Marshal(m)
			if err := json.Unmarshal(b, &again); err != nil {
				t.Fatal(err)
			}
			if ops, _ := Patch(&again, sidecarNode("web"), Config{Version: "v1"}); len(ops) != 0 {
				t.Errorf("an injected pod got another patch: %v", ops)
			}
		})
	}
}

func TestContainer(t *testing.T) {
	c := Container(sidecarNode("web"), Config{Image: "hoplink:v1"})
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("not a native sidecar: restartPolicy is not Always")
	}
	sc := c.SecurityContext
	if !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context is not restricted: %+v", sc)
	}
	if c.StartupProbe == nil || c.StartupProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("startup and readiness probes must ask /readyz (listeners open), nothing about peers")
	}
	if c.Image != "hoplink:v1" || !strings.Contains(strings.Join(c.Args, " "), "--name web --certs "+CertsDir) {
		t.Errorf("image %s args %v", c.Image, c.Args)
	}
	rn := sidecarNode("web")
	rn.Spec.TUN, rn.Spec.Image = true, "mine:v2"
	c = Container(rn, Config{Image: "hoplink:v1"})
	if c.Image != "mine:v2" || len(c.SecurityContext.Capabilities.Add) != 1 || c.SecurityContext.Capabilities.Add[0] != "NET_ADMIN" {
		t.Errorf("a TUN sidecar gets its RelayNode's image and NET_ADMIN alone: %s %+v", c.Image, c.SecurityContext.Capabilities)
	}
}

func TestPortClashes(t *testing.T) {
	pod := corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{
		{ContainerPort: 7401}, {ContainerPort: 7402}, {ContainerPort: 8080}, {ContainerPort: 7401, Protocol: corev1.ProtocolUDP}}}}}}
	_, w := Patch(&pod, sidecarNode("web"), Config{})
	if len(w) != 3 {
		t.Fatalf("want 3 warnings (7401/TCP, 7402/TCP, 7401/UDP), got %q", w)
	}
	for _, s := range w {
		if !strings.Contains(s, "spec.listen.port") {
			t.Errorf("warning %q does not say how to fix it", s)
		}
	}
}

// With pod certificates the key is the pod's own: the Secret gives only
// the CA, never the RelayNode's key.
func TestVolumesWithPodCertificates(t *testing.T) {
	for _, pc := range []bool{false, true} {
		v := Volumes(sidecarNode("web"), Config{PodCertificates: pc})[0]
		switch {
		case !pc && (v.Secret == nil || v.Secret.SecretName != "hoplink-relay-web"):
			t.Errorf("without pod certificates: %+v, want the RelayNode's Secret", v.VolumeSource)
		case pc && (v.Projected == nil || len(v.Projected.Sources) != 2):
			t.Fatalf("with pod certificates: %+v", v.VolumeSource)
		case pc:
			s, p := v.Projected.Sources[0].Secret, v.Projected.Sources[1].PodCertificate
			if s == nil || len(s.Items) != 1 || s.Items[0].Key != "ca.crt" {
				t.Errorf("the Secret projects %+v, want ca.crt alone", s)
			}
			if p == nil || p.SignerName != SignerName || p.KeyPath != "tls.key" || p.CertificateChainPath != "tls.crt" {
				t.Errorf("podCertificate %+v", p)
			}
		}
	}
}

// The metrics port is bound on the pod's IP alone: the argument names the
// variable the kubelet fills from status.podIP, in brackets, which hold
// both address families.
func TestMetricsBindThePodIP(t *testing.T) {
	c := Container(sidecarNode("web"), Config{})
	i := slices.Index(c.Args, "--metrics-addr")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("no --metrics-addr in %v", c.Args)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	}) {
		t.Fatalf("POD_IP does not come from status.podIP: %+v", c.Env)
	}
	for _, ip := range []string{"10.1.2.3", "fd00::5"} {
		// What the kubelet makes of $(POD_IP) in an argument.
		host, port, err := net.SplitHostPort(strings.ReplaceAll(c.Args[i+1], "$(POD_IP)", ip))
		if err != nil || host != ip || port != "7402" {
			t.Errorf("pod IP %s: --metrics-addr %q binds %q port %q (%v)", ip, c.Args[i+1], host, port, err)
		}
	}
}
