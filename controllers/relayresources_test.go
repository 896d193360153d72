package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Relay containers take the operator's default resources unless their
// RelayNode sets its own.
func TestRelayResourcesDefault(t *testing.T) {
	def := &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
	own := &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
	r := &RelayNodeReconciler{Image: "hoplink:dev", Resources: def}
	for _, tc := range []struct {
		name string
		spec *corev1.ResourceRequirements
		want corev1.ResourceRequirements
	}{
		{"default", nil, *def},
		{"own", own, *own},
	} {
		rn := &v1alpha1.RelayNode{}
		rn.Name, rn.Spec.Resources = "hk", tc.spec
		got := r.daemonSetSpec(rn, false).Template.Spec.Containers[0].Resources
		if !got.Limits.Memory().Equal(*tc.want.Limits.Memory()) || !got.Requests.Cpu().Equal(*tc.want.Requests.Cpu()) {
			t.Errorf("%s: resources %v, want %v", tc.name, got, tc.want)
		}
	}
	if r2 := (&RelayNodeReconciler{Image: "x"}); len(r2.daemonSetSpec(&v1alpha1.RelayNode{}, false).Template.Spec.Containers[0].Resources.Limits) != 0 {
		t.Error("resources without a default or a RelayNode's own")
	}
}
