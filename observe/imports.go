package observe

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
)

// Import is one port of a service imported from the clusterset (the
// Multi-Cluster Services API) as this cluster's clients reach it: its
// clusterset IPs, the cluster that serves the port, and the Tunnel, Chain
// and route its flows take through the relays.
type Import struct {
	Service string   `json:"service"` // namespace/name
	Type    string   `json:"type,omitempty"`
	IPs     []string `json:"ips,omitempty"`
	Port    string   `json:"port"`    // protocol/number
	Cluster string   `json:"cluster"` // the exporting cluster
	Tunnel  string   `json:"tunnel"`
	Chain   string   `json:"chain"`
	Route   []string `json:"route,omitempty"`
	// Ready is the Tunnel's Ready condition.
	Ready string `json:"ready"`
}

// ImportsFromCluster lists the imported services' ports that enter the
// relays at namespace ns's relays of this cluster (the clusterset's Tunnels
// whose Chain starts at a RelayNode that is not external), with the route
// each Chain's status says. Nothing when no import rides the relays there.
func ImportsFromCluster(ctx context.Context, c client.Reader, ns string) ([]Import, error) {
	var tl v1alpha1.TunnelList
	if err := c.List(ctx, &tl, client.InNamespace(ns), client.MatchingLabels{clusterset.LabelManaged: "true"}); err != nil || len(tl.Items) == 0 {
		return nil, err
	}
	var cl v1alpha1.ChainList
	var rl v1alpha1.RelayNodeList
	for _, l := range []client.ObjectList{&cl, &rl} {
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			return nil, err
		}
	}
	external := map[string]bool{}
	for _, r := range rl.Items {
		external[r.Name] = r.Spec.External
	}
	chains := map[string]*v1alpha1.Chain{}
	for i := range cl.Items {
		chains[cl.Items[i].Name] = &cl.Items[i]
	}
	imports := map[string]*mcsv1beta1.ServiceImport{}
	var il mcsv1beta1.ServiceImportList
	if err := c.List(ctx, &il, client.MatchingLabels{clusterset.LabelManaged: "true"}); err == nil {
		for i := range il.Items {
			imports[il.Items[i].Namespace+"/"+il.Items[i].Name] = &il.Items[i]
		}
	}
	var out []Import
	for _, t := range tl.Items {
		ch := chains[t.Spec.Chain]
		if ch == nil || external[ch.Spec.Entry] {
			continue // enters in another cluster
		}
		im := Import{Service: t.Annotations[clusterset.AnnotationService], Port: t.Annotations[clusterset.AnnotationPort],
			Cluster: t.Labels[clusterset.LabelSource], Tunnel: t.Name, Chain: ch.Name, Route: ch.Status.Route, Ready: "Unknown"}
		if si := imports[im.Service]; si != nil {
			im.Type, im.IPs = string(si.Spec.Type), si.Spec.IPs
		}
		if r := meta.FindStatusCondition(t.Status.Conditions, "Ready"); r != nil {
			im.Ready = string(r.Status)
		}
		out = append(out, im)
	}
	slices.SortFunc(out, func(a, b Import) int {
		return strings.Compare(a.Service+" "+a.Port+" "+a.Cluster, b.Service+" "+b.Port+" "+b.Cluster)
	})
	return out, nil
}
