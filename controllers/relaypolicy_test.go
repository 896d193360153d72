package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

func TestRelayPolicy(t *testing.T) {
	p := RelayPolicy{Image: "hoplink:1", AllowedImages: []string{"reg.example/hoplink:"}, Privileged: PrivilegedNamespaceLabel}
	opted := map[string]string{LabelPrivilegedRelays: "true"}
	rn := func(mut func(*v1alpha1.RelayNodeSpec)) *v1alpha1.RelayNode {
		r := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Name: "hk", Namespace: "edge"}}
		mut(&r.Spec)
		return r
	}
	pod := func(s *v1alpha1.RelayNodeSpec) { s.HostNetwork = ptr.To(false) }
	for _, tc := range []struct {
		name   string
		rn     *v1alpha1.RelayNode
		labels map[string]string
		any    bool
		reason string // "" allowed
		says   []string
	}{
		{"pod network, default image", rn(pod), nil, false, "", nil},
		{"the operator's image named", rn(func(s *v1alpha1.RelayNodeSpec) { pod(s); s.Image = "hoplink:1" }), nil, false, "", nil},
		{"an allowed prefix", rn(func(s *v1alpha1.RelayNodeSpec) { pod(s); s.Image = "reg.example/hoplink:2" }), nil, false, "", nil},
		{"an image of its own", rn(func(s *v1alpha1.RelayNodeSpec) { pod(s); s.Image = "evil:latest" }), opted, true, "ImageNotAllowed",
			[]string{`spec.image "evil:latest"`, "hoplink:1", "reg.example/hoplink:", "--allowed-relay-images", "relay.allowedImages"}},
		{"host network by default, namespace not opted in", rn(func(*v1alpha1.RelayNodeSpec) {}), nil, false, "PrivilegesNotAllowed",
			[]string{"spec.hostNetwork", `namespace "edge"`, "kubectl label namespace edge hoplink.dev/privileged-relays=true", "spec.hostNetwork: false"}},
		{"host network, namespace opted in", rn(func(*v1alpha1.RelayNodeSpec) {}), opted, false, "", nil},
		{"host network, any namespace", rn(func(*v1alpha1.RelayNodeSpec) {}), nil, true, "", nil},
		{"tun, namespace not opted in", rn(func(s *v1alpha1.RelayNodeSpec) { pod(s); s.TUN = true }), map[string]string{LabelPrivilegedRelays: "yes"}, false, "PrivilegesNotAllowed",
			[]string{"spec.tun", "root with NET_ADMIN", "remove spec.tun"}},
		{"tun, namespace opted in", rn(func(s *v1alpha1.RelayNodeSpec) { s.TUN = true }), opted, false, "", nil},
		// One policy for every form: a sidecar runs its image and its TUN
		// device in the pods it is injected into.
		{"a sidecar in the pod network, whatever hostNetwork says", rn(func(s *v1alpha1.RelayNodeSpec) { s.Sidecar = &v1alpha1.RelaySidecar{} }), nil, false, "", nil},
		{"a sidecar's image of its own", rn(func(s *v1alpha1.RelayNodeSpec) { s.Sidecar = &v1alpha1.RelaySidecar{}; s.Image = "evil:latest" }), opted, false, "ImageNotAllowed",
			[]string{`spec.image "evil:latest"`}},
		{"a sidecar's allowed image", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Sidecar = &v1alpha1.RelaySidecar{}
			s.Image = "reg.example/hoplink:3"
		}), nil, false, "", nil},
		{"a tun sidecar, namespace not opted in", rn(func(s *v1alpha1.RelayNodeSpec) { s.Sidecar = &v1alpha1.RelaySidecar{}; s.TUN = true }), nil, false, "PrivilegesNotAllowed",
			[]string{"spec.tun", "the sidecar relay of every pod it is injected into", "root with NET_ADMIN", "kubectl label namespace edge hoplink.dev/privileged-relays=true"}},
		{"a tun sidecar, namespace opted in", rn(func(s *v1alpha1.RelayNodeSpec) { s.Sidecar = &v1alpha1.RelaySidecar{}; s.TUN = true }), opted, false, "", nil},
		// Control-plane nodes hold the API server and etcd: even a
		// namespace allowed privileged relays does not place them there
		// unless it says so.
		{"tolerates the control-plane taint", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		}), opted, false, "ControlPlaneNotAllowed",
			[]string{`spec.tolerations[0] (key "node-role.kubernetes.io/control-plane")`, "kubectl label namespace edge hoplink.dev/control-plane-relays=true"}},
		{"tolerates every taint", rn(func(s *v1alpha1.RelayNodeSpec) {
			pod(s)
			s.Tolerations = []corev1.Toleration{{Key: "dedicated", Value: "relays"}, {Operator: corev1.TolerationOpExists}}
		}), nil, false, "ControlPlaneNotAllowed", []string{`spec.tolerations[1] (key "")`}},
		{"selects the old master label", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.NodeSelector = map[string]string{"node-role.kubernetes.io/master": ""}
		}), opted, false, "ControlPlaneNotAllowed", []string{`spec.nodeSelector "node-role.kubernetes.io/master"`}},
		{"control plane, namespace allowed it", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}
		}), map[string]string{LabelPrivilegedRelays: "true", LabelControlPlaneRelays: "true"}, false, "", nil},
		{"control plane, any namespace", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}), nil, true, "", nil},
		{"other tolerations", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "relays"}}
			s.NodeSelector = map[string]string{"hoplink.dev/site": "hk"}
		}), opted, false, "", nil},
		{"a sidecar's pods schedule as they say", rn(func(s *v1alpha1.RelayNodeSpec) {
			s.Sidecar = &v1alpha1.RelaySidecar{}
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}), nil, false, "", nil},
		{"external relays run nothing here", rn(func(s *v1alpha1.RelayNodeSpec) { s.External = true; s.Image = "evil:latest" }), nil, false, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := p
			if tc.any {
				pp.Privileged = PrivilegedAny
			}
			ref := pp.check(tc.rn, tc.labels)
			switch {
			case tc.reason == "" && ref != nil:
				t.Fatalf("refused: %s: %s", ref.reason, ref.message)
			case tc.reason == "":
				return
			case ref == nil:
				t.Fatalf("allowed, want %s", tc.reason)
			case ref.reason != tc.reason:
				t.Fatalf("reason %s, want %s", ref.reason, tc.reason)
			}
			for _, s := range tc.says {
				if !strings.Contains(ref.message, s) {
					t.Errorf("message %q does not say %q", ref.message, s)
				}
			}
		})
	}
}
