package controllers

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The About API (KEP 2149) names a cluster and its clusterset with
// cluster-scoped ClusterProperty objects, where it is installed.
// +kubebuilder:rbac:groups=about.k8s.io,resources=clusterproperties,verbs=get;list;watch
// The clusterset report the relays serve.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch

var clusterPropertyGVK = schema.GroupVersionKind{Group: "about.k8s.io", Version: "v1alpha1", Kind: "ClusterProperty"}

// Well-known ClusterProperty names.
const (
	PropertyClusterID  = "cluster.clusterset.k8s.io"
	PropertyClusterSet = "clusterset.k8s.io"
)

// clusterIdentity takes the cluster's ID and clusterset from the About API's
// ClusterProperties where they exist, else from the options; it says which
// it took, and when both name the cluster differently, that the property wins.
func clusterIdentity(ctx context.Context, c client.Reader, o MultiClusterOptions, log *slog.Logger) (MultiClusterOptions, error) {
	for _, p := range []struct {
		name string
		into *string
		flag string
	}{{PropertyClusterID, &o.ClusterID, "--cluster-id"}, {PropertyClusterSet, &o.ClusterSet, "--clusterset"}} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(clusterPropertyGVK)
		err := c.Get(ctx, types.NamespacedName{Name: p.name}, u)
		if err != nil {
			continue // no About API, or no such property: the option stands
		}
		v, _, _ := unstructured.NestedString(u.Object, "spec", "value")
		if v == "" {
			continue
		}
		if *p.into != "" && *p.into != v {
			log.Warn("the ClusterProperty and the flag disagree; the ClusterProperty wins", "property", p.name, "value", v, "flag", p.flag, "flagValue", *p.into)
		}
		*p.into = v
	}
	if o.ClusterID == "" {
		return o, fmt.Errorf("multicluster mode needs this cluster's ID: set --cluster-id (chart multicluster.clusterID) or create the About API's ClusterProperty %s", PropertyClusterID)
	}
	return o, nil
}

// setupMultiCluster adds the Multi-Cluster Services API's reconcilers and
// the exchange of reports with the other clusters.
func setupMultiCluster(mgr ctrl.Manager, o MultiClusterOptions, admin *relayAdmin, log *slog.Logger) error {
	log = logOr(log).With("controller", "clusterset", "cluster", o.ClusterID)
	set := newClusterSet(o, log)
	if err := mgr.Add(set); err != nil {
		return err
	}
	if err := (&ServiceExportReconciler{Client: mgr.GetClient(), Set: set}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("ServiceExport controller: %w", err)
	}
	if err := (&ServiceImportReconciler{Client: mgr.GetClient(), Set: set}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("ServiceImport controller: %w", err)
	}
	if err := (&ClusterSetRelaysReconciler{Client: mgr.GetClient(), Set: set}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("clusterset relays controller: %w", err)
	}
	if err := mgr.Add(&reportPublisher{client: mgr.GetClient(), api: mgr.GetAPIReader(), set: exchange{set}, log: log}); err != nil {
		return err
	}
	if o.CoreDNS.Name != "" {
		if err := mgr.Add(&coreDNS{client: mgr.GetClient(), api: mgr.GetAPIReader(), mapper: mgr.GetRESTMapper(), at: o.CoreDNS, log: log}); err != nil {
			return err
		}
	}
	log.Info("multicluster mode", "clusterset", o.ClusterSet, "gateway", o.Gateway.String(), "mode", o.Mode,
		"ports", fmt.Sprintf("%d-%d", o.Ports[0], o.Ports[1]))
	return mgr.Add(&reportPoller{client: mgr.GetClient(), api: admin.api, set: exchange{set}, log: log})
}
