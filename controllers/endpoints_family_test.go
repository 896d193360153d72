package controllers

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/manifest"
)

// The operator publishes what each running relay pod has: both families of
// a dual-stack pod (status.podIPs), the node's of a host-network one
// (status.hostIPs), IPv6 bracketed; IPv4-only clusters see what they saw.
func TestPodEndpointsEveryFamily(t *testing.T) {
	running := func(hostNet bool, st corev1.PodStatus) corev1.Pod {
		st.Phase = corev1.PodRunning
		return corev1.Pod{Spec: corev1.PodSpec{HostNetwork: hostNet}, Status: st}
	}
	podIPs := func(ips ...string) []corev1.PodIP {
		var out []corev1.PodIP
		for _, ip := range ips {
			out = append(out, corev1.PodIP{IP: ip})
		}
		return out
	}
	hostIPs := func(ips ...string) []corev1.HostIP {
		var out []corev1.HostIP
		for _, ip := range ips {
			out = append(out, corev1.HostIP{IP: ip})
		}
		return out
	}
	gone := running(false, corev1.PodStatus{PodIP: "10.244.0.9"})
	gone.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want []string
	}{
		{"ipv4 single-stack", []corev1.Pod{running(false, corev1.PodStatus{PodIP: "10.244.0.5", PodIPs: podIPs("10.244.0.5")})},
			[]string{"10.244.0.5:7401"}},
		{"ipv6 single-stack", []corev1.Pod{running(false, corev1.PodStatus{PodIP: "fd00:10:244::5", PodIPs: podIPs("fd00:10:244::5")})},
			[]string{"[fd00:10:244::5]:7401"}},
		{"dual-stack, ipv4 primary", []corev1.Pod{running(false, corev1.PodStatus{PodIP: "10.244.0.5", PodIPs: podIPs("10.244.0.5", "fd00:10:244::5")})},
			[]string{"10.244.0.5:7401", "[fd00:10:244::5]:7401"}},
		{"dual-stack, ipv6 primary", []corev1.Pod{running(false, corev1.PodStatus{PodIP: "fd00:10:244::5", PodIPs: podIPs("fd00:10:244::5", "10.244.0.5")})},
			[]string{"10.244.0.5:7401", "[fd00:10:244::5]:7401"}},
		{"only the singular field (hand-written status)", []corev1.Pod{running(false, corev1.PodStatus{PodIP: "fd00::7"})},
			[]string{"[fd00::7]:7401"}},
		{"host network, dual-stack node", []corev1.Pod{running(true, corev1.PodStatus{PodIP: "172.18.0.2", HostIP: "172.18.0.2",
			PodIPs: podIPs("172.18.0.2", "fc00:f853:ccd:e793::2"), HostIPs: hostIPs("172.18.0.2", "fc00:f853:ccd:e793::2")})},
			[]string{"172.18.0.2:7401", "[fc00:f853:ccd:e793::2]:7401"}},
		{"host network, node before hostIPs", []corev1.Pod{running(true, corev1.PodStatus{PodIP: "10.244.0.5", HostIP: "172.18.0.2"})},
			[]string{"172.18.0.2:7401"}},
		{"host network ignores the pod's own addresses", []corev1.Pod{running(true, corev1.PodStatus{PodIP: "10.244.0.5",
			PodIPs: podIPs("10.244.0.5", "fd00::5"), HostIP: "fc00::2", HostIPs: hostIPs("fc00::2")})},
			[]string{"[fc00::2]:7401"}},
		{"two pods dual, one pending, one terminating", []corev1.Pod{
			running(false, corev1.PodStatus{PodIP: "10.244.1.5", PodIPs: podIPs("10.244.1.5", "fd00:1::5")}),
			running(false, corev1.PodStatus{PodIP: "10.244.0.5", PodIPs: podIPs("10.244.0.5", "fd00::5")}),
			{Status: corev1.PodStatus{Phase: corev1.PodPending, PodIP: "10.244.2.5"}},
			gone,
		}, []string{"10.244.0.5:7401", "10.244.1.5:7401", "[fd00:1::5]:7401", "[fd00::5]:7401"}},
		{"no address yet", []corev1.Pod{running(false, corev1.PodStatus{})}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podEndpoints(tc.pods, 7401); !slices.Equal(got, tc.want) {
				t.Errorf("podEndpoints = %q, want %q", got, tc.want)
			}
		})
	}
}

// The operator asks each relay pod once although a dual-stack pod is
// published on two addresses: it merges pods' answers, and a pod asked
// twice would count twice.
func TestOneFamilyAsksEachPodOnce(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"10.0.0.1:7401", "10.0.0.2:7401"}, []string{"10.0.0.1:7401", "10.0.0.2:7401"}},
		{[]string{"[fd00::1]:7401"}, []string{"[fd00::1]:7401"}},
		{[]string{"10.0.0.1:7401", "10.0.0.2:7401", "[fd00::1]:7401", "[fd00::2]:7401"}, []string{"10.0.0.1:7401", "10.0.0.2:7401"}},
		{[]string{"[fd00::1]:7401", "10.0.0.1:7401"}, []string{"[fd00::1]:7401"}}, // a tie: the first's family
		// A pod with IPv6 only beside dual-stack ones: the family all have.
		{[]string{"10.0.0.1:7401", "[fd00::1]:7401", "[fd00::2]:7401"}, []string{"[fd00::1]:7401", "[fd00::2]:7401"}},
		{[]string{"relay.example.net:7401", "10.0.0.1:7401", "[fd00::1]:7401"}, []string{"relay.example.net:7401", "10.0.0.1:7401"}},
	} {
		if got := oneFamily(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("oneFamily(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A Tunnel's Service takes both families while its entry listens on every
// address, one while it listens on one address.
func TestServiceFamilies(t *testing.T) {
	for listen, want := range map[string]corev1.IPFamilyPolicy{
		"": corev1.IPFamilyPolicyPreferDualStack, "0.0.0.0": corev1.IPFamilyPolicyPreferDualStack, "::": corev1.IPFamilyPolicyPreferDualStack,
		"10.0.0.1": corev1.IPFamilyPolicySingleStack, "fd00::1": corev1.IPFamilyPolicySingleStack, "127.0.0.1": corev1.IPFamilyPolicySingleStack,
	} {
		if got := serviceFamilies(listen); got != want {
			t.Errorf("serviceFamilies(%q) = %s, want %s", listen, got, want)
		}
	}
}

// podIPs gives every family of a pod once, the primary first: a dual-stack
// gateway pod then stands in an import's slice of each family.
func TestPodIPs(t *testing.T) {
	for _, tc := range []struct {
		st   corev1.PodStatus
		want []string
	}{
		{corev1.PodStatus{}, nil},
		{corev1.PodStatus{PodIP: "10.244.0.5"}, []string{"10.244.0.5"}},
		{corev1.PodStatus{PodIP: "fd00::5", PodIPs: []corev1.PodIP{{IP: "fd00::5"}}}, []string{"fd00::5"}},
		{corev1.PodStatus{PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}, {IP: "fd00::5"}}}, []string{"10.244.0.5", "fd00::5"}},
		{corev1.PodStatus{PodIP: "fd00::5", PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.244.0.5"}}}, []string{"fd00::5", "10.244.0.5"}},
	} {
		if got := podIPs(&corev1.Pod{Status: tc.st}); !slices.Equal(got, tc.want) {
			t.Errorf("podIPs(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}

// The route controller asks each sidecar replica it picks once, on the
// family most of their endpoints have, whatever families its pod has.
func TestOneEachAsksAReplicaOnce(t *testing.T) {
	reps := []manifest.Replica{
		{Name: "a", Endpoints: []string{"10.0.0.1:7401", "[fd00::1]:7401"}},
		{Name: "b", Endpoints: []string{"10.0.0.2:7401", "[fd00::2]:7401"}},
		{Name: "c", Endpoints: []string{"[fd00::3]:7401"}},
	}
	if got, want := oneEach(reps), []string{"[fd00::1]:7401", "[fd00::2]:7401", "[fd00::3]:7401"}; !slices.Equal(got, want) {
		t.Errorf("oneEach = %v, want %v", got, want)
	}
	reps[2] = manifest.Replica{Name: "c", Endpoints: []string{"10.0.0.3:7401"}}
	if got, want := oneEach(reps), []string{"10.0.0.1:7401", "10.0.0.2:7401", "10.0.0.3:7401"}; !slices.Equal(got, want) {
		t.Errorf("oneEach = %v, want %v", got, want)
	}
}
