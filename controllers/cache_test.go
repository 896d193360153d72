package controllers

import (
	"context"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The operator's ClusterRole lists these kinds everywhere, but its cache
// holds only what it made: another team's Secrets, DaemonSets, Roles,
// RoleBindings, ServiceAccounts and Services are neither kept in its
// memory nor readable by its reconcilers.
func TestCacheHoldsOnlyHoplinksObjects(t *testing.T) {
	needAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := namespace(t)
	theirs := metav1.ObjectMeta{Name: "theirs", Namespace: ns, Labels: map[string]string{"app": "other"}}
	ours := metav1.ObjectMeta{Name: "ours", Namespace: ns, Labels: relayLabels("r")}
	pod := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	dsSpec := appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}, Template: pod}
	svcSpec := corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}
	roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "x"}
	for _, om := range []metav1.ObjectMeta{theirs, ours} {
		for _, o := range []client.Object{
			&corev1.Secret{ObjectMeta: om},
			&corev1.ServiceAccount{ObjectMeta: om},
			&rbacv1.Role{ObjectMeta: om},
			&rbacv1.RoleBinding{ObjectMeta: om, RoleRef: roleRef},
			&appsv1.DaemonSet{ObjectMeta: om, Spec: dsSpec},
			&corev1.Service{ObjectMeta: om, Spec: svcSpec},
		} {
			if err := k8s.Create(ctx, o); err != nil {
				t.Fatalf("%T %s: %v", o, om.Name, err)
			}
		}
	}

	c, err := cache.New(cfg, cache.Options{Scheme: Scheme(), DefaultNamespaces: map[string]cache.Config{ns: {}}, ByObject: cacheOptions(Options{}).ByObject})
	if err != nil {
		t.Fatal(err)
	}
	go c.Start(ctx)
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	for _, list := range []client.ObjectList{
		&corev1.SecretList{}, &corev1.ServiceAccountList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{},
		&appsv1.DaemonSetList{}, &corev1.ServiceList{},
	} {
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatalf("%T: %v", list, err)
		}
		var names []string
		items, err := apimeta.ExtractList(list)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			names = append(names, o.(client.Object).GetName())
		}
		if !slices.Equal(names, []string{"ours"}) {
			t.Errorf("%T in the operator's cache: %v; want only [ours]", list, names)
		}
	}
}
