package controllers

import (
	"context"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/clusterset"
)

// coreDNS keeps the clusterset zone in CoreDNS's Corefile (the ConfigMap and
// Deployment named in the options, both named coredns by kubeadm): CoreDNS
// 1.12.2 and later then answer NAME.NS.svc.clusterset.local from
// ServiceImports. It looks at start and every few minutes, since an upgrade
// of the cluster may write kubeadm's Corefile back; it changes nothing
// while the ServiceImport CRD is missing, for CoreDNS that watches a kind
// the API server does not serve never turns ready, and DNS stops.
type coreDNS struct {
	client client.Client
	api    client.Reader // kube-system's ConfigMaps are not cached
	mapper meta.RESTMapper
	at     types.NamespacedName
	log    *slog.Logger
}

// coreDNSRecheck is how often the Corefile is looked at again.
const coreDNSRecheck = 5 * time.Minute

func (d *coreDNS) Start(ctx context.Context) error {
	for {
		d.ensure(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(coreDNSRecheck):
		}
	}
}

func (d *coreDNS) ensure(ctx context.Context) {
	log := d.log.With("configmap", d.at.String())
	gk := schema.GroupKind{Group: mcsv1beta1.GroupName, Kind: "ServiceImport"}
	if _, err := d.mapper.RESTMapping(gk, mcsv1beta1.GroupVersion.Version); err != nil {
		log.Error("not adding the clusterset zone to CoreDNS: the API server serves no ServiceImports (install the MCS CRDs: chart value multicluster.installCRDs)", "err", err)
		return
	}
	var cm corev1.ConfigMap
	if err := d.api.Get(ctx, d.at, &cm); err != nil {
		log.Error("cannot read CoreDNS's Corefile; add the clusterset zone by hand (docs/multi-cluster.md)", "err", err)
		return
	}
	out, changed, err := clusterset.Corefile(cm.Data["Corefile"])
	if err != nil {
		log.Error("cannot add the clusterset zone to CoreDNS's Corefile; add it by hand (docs/multi-cluster.md)", "err", err)
		return
	}
	if !changed {
		return
	}
	cm.Data["Corefile"] = out
	if err := d.client.Update(ctx, &cm); err != nil {
		log.Error("cannot write CoreDNS's Corefile", "err", err)
		return
	}
	// The kubelet takes a minute or two to hand CoreDNS a changed
	// ConfigMap; new pods read it at once.
	var dep appsv1.Deployment
	dep.Namespace, dep.Name = d.at.Namespace, d.at.Name
	patch := []byte(`{"spec":{"template":{"metadata":{"annotations":{"hoplink.dev/corefile-changed":"` + time.Now().UTC().Format(time.RFC3339) + `"}}}}}`)
	if err := d.client.Patch(ctx, &dep, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		log.Warn("wrote the clusterset zone into the Corefile, but cannot restart CoreDNS's pods: they take it within a few minutes", "err", err)
		return
	}
	log.Info("added the clusterset zone to CoreDNS's Corefile and restarted CoreDNS", "zone", clusterset.Zone)
}
