package clusterset

import (
	"cmp"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A flow from a client in cluster X to an import's port served by cluster Y
// enters the relays at X's gateway (a Tunnel's listener), follows the Chain
// from X's gateway to Y's, routed by measurement through the relays every
// cluster knows, and leaves at Y's gateway, which dials the Service's
// cluster IP in Y. Every relay on the way admits it against its own
// cluster's copy of that Chain and Tunnel, so every cluster holds the same
// Chains and Tunnels: each builds them from the same Reports.

// Tunnel is a Tunnel the clusterset needs, with the clusters it joins.
type Tunnel struct {
	v1alpha1.Tunnel
	// Entry is the cluster whose gateway listens for it; Source the one
	// whose Service it reaches.
	Entry, Source string
}

// Tunnels lists the Tunnels of every ClusterSetIP service's TCP and UDP
// ports, from every cluster to every other cluster that serves the port,
// in namespace ns (the relays'). Their listen ports are left 0: the entry
// cluster gives them (Report.Entries).
func Tunnels(ns string, reports []*Report, services []*Service) []Tunnel {
	var out []Tunnel
	for _, s := range services {
		if s.Spec.Type != mcsv1beta1.ClusterSetIP {
			continue
		}
		for i, p := range s.Spec.Ports {
			if !Carried(p.Protocol) {
				continue
			}
			for _, src := range s.Serving[i] {
				e := s.exports[src]
				target := net.JoinHostPort(e.Address, strconv.Itoa(int(p.Port)))
				for _, r := range reports {
					if r.Cluster == src || slices.Contains(s.Lacking, r.Cluster) {
						continue
					}
					out = append(out, Tunnel{Tunnel: tunnel(ns, r.Cluster, src, s, p, target), Entry: r.Cluster, Source: src})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Tunnel) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func tunnel(ns, entry, source string, s *Service, p mcsv1beta1.ServicePort, target string) v1alpha1.Tunnel {
	proto := v1alpha1.ProtocolTCP
	if p.Protocol == corev1.ProtocolUDP {
		proto = v1alpha1.ProtocolUDP
	}
	return v1alpha1.Tunnel{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Tunnel"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TunnelName(entry, source, s.Namespace, s.Name, p.Protocol, p.Port),
			Labels: map[string]string{LabelManaged: "true", LabelEntry: entry, LabelSource: source},
			Annotations: map[string]string{AnnotationService: s.Key(),
				AnnotationPort: string(p.Protocol) + "/" + strconv.Itoa(int(p.Port))}},
		Spec: v1alpha1.TunnelSpec{
			Chain:    ChainName(entry, source),
			Protocol: proto,
			Listen:   &v1alpha1.TunnelListen{},
			Target:   target,
		},
	}
}

// Chains lists the Chains the Tunnels ride, from each cluster's gateway to
// each other cluster's, in namespace ns: one per pair, whether a service
// needs it now or not, so that an import that comes finds it measured and
// routed. A Chain routes (in its entry cluster's mode, sum by default)
// through the relays that every cluster of the set knows, since every
// cluster's copy must allow the same routes.
func Chains(ns string, reports []*Report) []v1alpha1.Chain {
	common := commonRelays(reports)
	var out []v1alpha1.Chain
	for _, entry := range reports {
		for _, source := range reports {
			if entry.Cluster == source.Cluster || entry.Gateway == source.Gateway {
				continue
			}
			mode := v1alpha1.ModeSum
			if entry.Mode == string(v1alpha1.ModePipe) {
				mode = v1alpha1.ModePipe
			}
			var via []string
			for _, r := range common {
				if r != entry.Gateway && r != source.Gateway {
					via = append(via, r)
				}
			}
			if len(via) > 32 {
				via = via[:32] // a Chain names at most 32 via relays
			}
			out = append(out, v1alpha1.Chain{
				TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Chain"},
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ChainName(entry.Cluster, source.Cluster),
					Labels: map[string]string{LabelManaged: "true", LabelEntry: entry.Cluster, LabelSource: source.Cluster}},
				Spec: v1alpha1.ChainSpec{Entry: entry.Gateway, Exit: source.Gateway, Via: via, Mode: mode},
			})
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.Chain) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// commonRelays are the relays every Report knows, sorted.
func commonRelays(reports []*Report) []string {
	if len(reports) == 0 {
		return nil
	}
	var out []string
	for _, n := range reports[0].Known {
		all := true
		for _, r := range reports[1:] {
			all = all && slices.Contains(r.Known, n)
		}
		if all {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
