package main

import (
	"context"
	"maps"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/inject"
)

const (
	sidecarName       = inject.ContainerName
	annotationVersion = inject.AnnotationVersion
)

// standInKubelet marks every relay DaemonSet as having one ready pod, and
// makes that pod, as the DaemonSet controller and a kubelet would; it reads
// the DaemonSets from the bench's watches (w), as they do.
func standInKubelet(ctx context.Context, c client.Client, w client.Reader) {
	done := map[string]bool{}
	for ctx.Err() == nil {
		var dss appsv1.DaemonSetList
		if err := w.List(ctx, &dss, client.InNamespace(ns)); err == nil {
			for i := range dss.Items {
				ds := &dss.Items[i]
				if done[ds.Name] {
					continue
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ds.Name + "-0", Labels: ds.Spec.Template.Labels},
					Spec: *ds.Spec.Template.Spec.DeepCopy()}
				if err := c.Create(ctx, pod); err != nil && !strings.Contains(err.Error(), "already exists") {
					continue
				}
				pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.244.0.1",
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
				if c.Status().Update(ctx, pod) != nil {
					continue
				}
				ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, NumberReady: 1, NumberAvailable: 1}
				if c.Status().Update(ctx, ds) == nil {
					done[ds.Name] = true
				}
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// standInSlices writes one EndpointSlice for each sidecar relay's headless
// Service, listing its ready pods and copying the Service's labels, as the
// EndpointSlice controller does; it writes only what changed. It reads
// from the bench's watches (w), as that controller does.
func standInSlices(ctx context.Context, c client.Client, w client.Reader) {
	for ctx.Err() == nil {
		var svcs corev1.ServiceList
		var pods corev1.PodList
		var slices discoveryv1.EndpointSliceList
		hasRelay := client.HasLabels{controllers.LabelRelayNode}
		if w.List(ctx, &svcs, client.InNamespace(ns), hasRelay) != nil || w.List(ctx, &pods, client.InNamespace(ns), hasRelay) != nil ||
			w.List(ctx, &slices, client.InNamespace(ns)) != nil {
			time.Sleep(time.Second)
			continue
		}
		ips := map[string][]string{}
		for _, p := range pods.Items {
			ips[p.Labels[controllers.LabelRelayNode]] = append(ips[p.Labels[controllers.LabelRelayNode]], p.Status.PodIP)
		}
		have := map[string]*discoveryv1.EndpointSlice{}
		for i := range slices.Items {
			have[slices.Items[i].Name] = &slices.Items[i]
		}
		for _, svc := range svcs.Items {
			if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				continue
			}
			labels := maps.Clone(svc.Labels)
			labels[discoveryv1.LabelServiceName] = svc.Name
			var eps []discoveryv1.Endpoint
			for _, ip := range ips[svc.Labels[controllers.LabelRelayNode]] {
				eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
			}
			old := have[svc.Name+"-1"]
			switch {
			case old == nil:
				c.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc.Name + "-1", Labels: labels},
					AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps})
			case !maps.Equal(old.Labels, labels) || len(old.Endpoints) != len(eps):
				old.Labels, old.Endpoints = labels, eps
				c.Update(ctx, old)
			}
		}
		time.Sleep(2 * time.Second)
	}
}
