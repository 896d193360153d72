package clusterset

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// ServiceImport is the import of s in any cluster: the merged spec, the
// exported labels and annotations of the oldest export, and the exporting
// clusters of its type. ips and families are the cluster's own clusterset
// IPs (its derived Service's; none for a headless import).
func ServiceImport(s *Service, ips []string, families []corev1.IPFamily) *mcsv1beta1.ServiceImport {
	si := &mcsv1beta1.ServiceImport{
		TypeMeta: metav1.TypeMeta{APIVersion: mcsv1beta1.GroupVersion.String(), Kind: "ServiceImport"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name,
			Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: *s.Spec.DeepCopy(),
	}
	for k, v := range s.Labels {
		si.Labels[k] = v
	}
	for k, v := range s.Annotations {
		si.Annotations[k] = v
	}
	si.Labels[LabelManaged] = "true"
	if len(si.Annotations) == 0 {
		si.Annotations = nil
	}
	if s.Spec.Type == mcsv1beta1.ClusterSetIP {
		si.Spec.IPs, si.Spec.IPFamilies = slices.Clone(ips), slices.Clone(families)
	}
	for _, c := range s.Exporters {
		if s.exports[c].Type == s.Spec.Type {
			si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
		}
	}
	return si
}

// DerivedService is the Service, in the import's namespace, whose cluster
// IPs are a ClusterSetIP import's clusterset IPs: kube-proxy sends what
// reaches them to the endpoints EndpointSlices lists. It takes the cluster's
// own IP families (the relays carry a flow whatever its family); SCTP ports
// are left out, since no relay carries SCTP. Nil for a headless import.
func DerivedService(s *Service) *corev1.Service {
	if s.Spec.Type != mcsv1beta1.ClusterSetIP {
		return nil
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: DerivedName(s.Name),
			Labels: map[string]string{LabelManaged: "true", mcsv1beta1.LabelServiceName: s.Name}},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyPreferDualStack),
			SessionAffinity:       s.Spec.SessionAffinity,
			SessionAffinityConfig: s.Spec.SessionAffinityConfig.DeepCopy(),
		},
	}
	if svc.Spec.SessionAffinity == "" {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	for _, p := range s.Spec.Ports {
		if !Carried(p.Protocol) {
			continue
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, AppProtocol: p.AppProtocol})
	}
	return svc
}

// Carried reports whether relays carry a port's protocol (TCP and UDP).
func Carried(p corev1.Protocol) bool { return p == corev1.ProtocolTCP || p == corev1.ProtocolUDP }

// GatewayPod is one address of a relay pod of a cluster's gateway
// RelayNode (a dual-stack pod has one of each family): where its clients'
// flows to imported services enter the relays.
type GatewayPod struct {
	Address  string
	Ready    bool
	NodeName string
}

// Sources are what a cluster has to build an import's EndpointSlices.
type Sources struct {
	// Self is this cluster's ID.
	Self string
	// Gateway are this cluster's gateway relay pods.
	Gateway []GatewayPod
	// Listen is the listen port of each Tunnel entering at this cluster's
	// gateway, by name, for the Tunnels the exporting cluster holds too.
	Listen map[string]int32
	// Local are this cluster's own EndpointSlices of the Service, when it
	// exports it: its own clients reach them directly.
	Local []discoveryv1.EndpointSlice
	// Down are the clusters flows cannot reach now.
	Down map[string]bool
	// Cost is how far each other cluster is, measured (the route of the
	// Chain to it); a cluster missing from it is of unknown distance.
	Cost map[string]time.Duration
}

// EndpointSlices are the EndpointSlices of s in cluster src.Self, with the
// MCS labels: for a ClusterSetIP import, those of its derived Service,
// which kube-proxy balances over; for a headless one, each exporting
// cluster's endpoints, which DNS answers with.
//
// A ClusterSetIP import's port is reached in the cluster's own Service when
// the cluster exports it, else through the gateway's Tunnel to the nearest
// cluster that serves it (within max(10%, 2 ms) of the nearest, all of
// them; all while distances are unknown). The other clusters' endpoints
// stay listed but not ready, so that kube-proxy uses them only once the
// operator makes them ready: when the nearest cluster goes down.
func EndpointSlices(s *Service, src Sources) []discoveryv1.EndpointSlice {
	if s.Spec.Type == mcsv1beta1.Headless {
		return headlessSlices(s)
	}
	type group struct {
		cluster string
		active  bool
	}
	ports := map[group][]int{} // port indexes of s.Spec.Ports
	for i, p := range s.Spec.Ports {
		if !Carried(p.Protocol) {
			continue
		}
		var usable []string
		for _, c := range s.Serving[i] {
			if src.usable(s, c, p) {
				usable = append(usable, c)
			}
		}
		pref := preferred(src, usable)
		for _, c := range usable {
			g := group{c, slices.Contains(pref, c)}
			ports[g] = append(ports[g], i)
		}
	}
	groups := make([]group, 0, len(ports))
	for g := range ports {
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b group) int {
		return cmp.Or(cmp.Compare(a.cluster, b.cluster), -cmp.Compare(b2i(a.active), b2i(b.active)))
	})
	var out []discoveryv1.EndpointSlice
	for _, g := range groups {
		if g.cluster == src.Self {
			out = append(out, localSlices(s, src, g.active, ports[g])...)
		} else {
			out = append(out, gatewaySlices(s, src, g.cluster, g.active, ports[g])...)
		}
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// usable reports whether cluster c can take port p's flows from src.Self.
func (src Sources) usable(s *Service, c string, p mcsv1beta1.ServicePort) bool {
	if c == src.Self {
		for _, sl := range src.Local {
			for _, lp := range sl.Ports {
				if ptr.Deref(lp.Name, "") == p.Name && ptr.Deref(lp.Protocol, corev1.ProtocolTCP) == p.Protocol {
					return true
				}
			}
		}
		return false
	}
	return !src.Down[c] && len(src.Gateway) > 0 && src.Listen[TunnelName(src.Self, c, s.Namespace, s.Name, p.Protocol, p.Port)] > 0
}

// preferred picks from the usable clusters those a port's flows go to:
// this cluster if it serves the port, else the nearest (all while any
// distance is unknown).
func preferred(src Sources, usable []string) []string {
	if slices.Contains(usable, src.Self) {
		return []string{src.Self}
	}
	if len(usable) == 0 {
		return nil
	}
	best := time.Duration(-1)
	for _, c := range usable {
		d, ok := src.Cost[c]
		if !ok {
			return usable
		}
		if best < 0 || d < best {
			best = d
		}
	}
	margin := max(best/10, 2*time.Millisecond)
	var out []string
	for _, c := range usable {
		if src.Cost[c] <= best+margin {
			out = append(out, c)
		}
	}
	return out
}

// sliceMeta names and labels an EndpointSlice of s from cluster: one per
// cluster, address type and role. A ClusterSetIP import's slices belong to
// its derived Service; a headless import's to none.
func sliceMeta(s *Service, cluster, suffix string, t discoveryv1.AddressType) metav1.ObjectMeta {
	fam := "4"
	if t == discoveryv1.AddressTypeIPv6 {
		fam = "6"
	}
	derived := DerivedName(s.Name)
	m := metav1.ObjectMeta{Namespace: s.Namespace, Name: derived + "-" + cluster + suffix + "-" + fam,
		Labels: map[string]string{
			LabelManaged:                  "true",
			mcsv1beta1.LabelServiceName:   s.Name,
			mcsv1beta1.LabelSourceCluster: cluster,
			discoveryv1.LabelManagedBy:    EndpointSliceManager,
		}}
	if s.Spec.Type == mcsv1beta1.ClusterSetIP {
		m.Labels[discoveryv1.LabelServiceName] = derived
	}
	return m
}

func roleSuffix(active bool) string {
	if active {
		return ""
	}
	return "-standby"
}

// localSlices lists this cluster's own endpoints of the ports at idx.
func localSlices(s *Service, src Sources, active bool, idx []int) []discoveryv1.EndpointSlice {
	byType := map[discoveryv1.AddressType]*discoveryv1.EndpointSlice{}
	var order []discoveryv1.AddressType
	for _, l := range src.Local {
		var ports []discoveryv1.EndpointPort
		for _, lp := range l.Ports {
			for _, i := range idx {
				p := s.Spec.Ports[i]
				if ptr.Deref(lp.Name, "") == p.Name && ptr.Deref(lp.Protocol, corev1.ProtocolTCP) == p.Protocol {
					ports = append(ports, *lp.DeepCopy())
				}
			}
		}
		if len(ports) == 0 || len(l.Endpoints) == 0 {
			continue
		}
		out := byType[l.AddressType]
		if out == nil {
			out = &discoveryv1.EndpointSlice{
				TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
				ObjectMeta:  sliceMeta(s, src.Self, roleSuffix(active), l.AddressType),
				AddressType: l.AddressType, Ports: ports,
			}
			byType[l.AddressType] = out
			order = append(order, l.AddressType)
		}
		for _, ep := range l.Endpoints {
			if len(out.Endpoints) >= MaxEndpoints {
				break
			}
			e := discoveryv1.Endpoint{Addresses: slices.Clone(ep.Addresses), Hostname: ep.Hostname,
				NodeName: ep.NodeName, Zone: ep.Zone, Conditions: *ep.Conditions.DeepCopy()}
			if !active {
				e.Conditions = standby()
			}
			out.Endpoints = append(out.Endpoints, e)
		}
	}
	slices.Sort(order)
	res := make([]discoveryv1.EndpointSlice, 0, len(order))
	for _, t := range order {
		res = append(res, *byType[t])
	}
	return res
}

// standby are the conditions of endpoints kept for a failover: neither
// ready nor serving, so kube-proxy leaves them alone.
func standby() discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
}

// gatewaySlices lists this cluster's gateway relays, at the listen ports of
// the Tunnels to cluster c for the ports at idx.
func gatewaySlices(s *Service, src Sources, c string, active bool, idx []int) []discoveryv1.EndpointSlice {
	var ports []discoveryv1.EndpointPort
	for _, i := range idx {
		p := s.Spec.Ports[i]
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), AppProtocol: p.AppProtocol,
			Port: ptr.To(src.Listen[TunnelName(src.Self, c, s.Namespace, s.Name, p.Protocol, p.Port)])})
	}
	byType := map[discoveryv1.AddressType][]discoveryv1.Endpoint{}
	for _, g := range src.Gateway {
		a, err := netip.ParseAddr(g.Address)
		if err != nil {
			continue
		}
		t := discoveryv1.AddressTypeIPv4
		if !a.Unmap().Is4() {
			t = discoveryv1.AddressTypeIPv6
		}
		cond := discoveryv1.EndpointConditions{Ready: ptr.To(g.Ready), Serving: ptr.To(g.Ready), Terminating: ptr.To(false)}
		if !active {
			cond = standby()
		}
		ep := discoveryv1.Endpoint{Addresses: []string{a.Unmap().String()}, Conditions: cond}
		if g.NodeName != "" {
			ep.NodeName = ptr.To(g.NodeName)
		}
		byType[t] = append(byType[t], ep)
	}
	var out []discoveryv1.EndpointSlice
	for _, t := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		eps := byType[t]
		if len(eps) == 0 {
			continue
		}
		if len(eps) > MaxEndpoints {
			eps = eps[:MaxEndpoints]
		}
		out = append(out, discoveryv1.EndpointSlice{
			TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta:  sliceMeta(s, c, roleSuffix(active), t),
			AddressType: t, Ports: slices.Clone(ports), Endpoints: eps,
		})
	}
	return out
}

// headlessSlices lists each exporting cluster's endpoints of a headless
// import, for DNS: they belong to no Service of this cluster.
func headlessSlices(s *Service) []discoveryv1.EndpointSlice {
	var out []discoveryv1.EndpointSlice
	for _, c := range s.Exporters {
		e := s.exports[c]
		if e.Type != mcsv1beta1.Headless {
			continue
		}
		for _, set := range e.Endpoints {
			if len(set.Endpoints) == 0 {
				continue
			}
			sl := discoveryv1.EndpointSlice{
				TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
				ObjectMeta:  sliceMeta(s, c, "", set.AddressType),
				AddressType: set.AddressType,
			}
			for _, p := range set.Ports {
				sl.Ports = append(sl.Ports, *p.DeepCopy())
			}
			for _, ep := range set.Endpoints {
				e := discoveryv1.Endpoint{Addresses: slices.Clone(ep.Addresses),
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ep.Ready)}}
				if ep.Hostname != "" {
					e.Hostname = ptr.To(ep.Hostname)
				}
				sl.Endpoints = append(sl.Endpoints, e)
			}
			out = append(out, sl)
		}
	}
	return out
}
