package clusterset

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// view is what a cluster's import says of each cluster's slices:
// "cluster:active|standby:port/listen,...".
func view(eps []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range eps {
		role := "active"
		if strings.HasSuffix(strings.TrimSuffix(strings.TrimSuffix(s.Name, "-4"), "-6"), "-standby") {
			role = "standby"
		}
		var ports []string
		for _, p := range s.Ports {
			ports = append(ports, ptr.Deref(p.Name, "")+"/"+strconv.Itoa(int(ptr.Deref(p.Port, 0))))
		}
		ready := true
		for _, e := range s.Endpoints {
			ready = ready && ptr.Deref(e.Conditions.Ready, true)
		}
		if ready != (role == "active") {
			role += "(ready mismatch)"
		}
		out = append(out, s.Labels[mcsv1beta1.LabelSourceCluster]+":"+role+":"+strings.Join(ports, ","))
	}
	return out
}

// three clusters export hello; c calls it through its gateway.
func threeExporters() *Service {
	return Merge([]*Report{hello("a", t0, nil), hello("b", t0.Add(time.Second), nil), hello("c", t0.Add(2*time.Second), nil)})[0]
}

func listenAll(self string, s *Service, ports ...int32) map[string]int32 {
	out := map[string]int32{}
	i := 0
	for _, c := range []string{"a", "b", "c"} {
		if c == self {
			continue
		}
		for _, p := range s.Spec.Ports {
			out[TunnelName(self, c, s.Namespace, s.Name, p.Protocol, p.Port)] = ports[i]
			i++
		}
	}
	return out
}

func TestEndpointSlicesPreferTheNearestCluster(t *testing.T) {
	s := Merge([]*Report{hello("a", t0, nil), hello("b", t0.Add(time.Second), nil)})[0]
	local := []discoveryv1.EndpointSlice{{AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(42))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}}
	gw := []GatewayPod{{Address: "172.18.0.3", Ready: true}}
	for _, tc := range []struct {
		name string
		src  Sources
		want []string
	}{
		{
			// A cluster that exports the service keeps its clients at home
			// (for the port its own endpoints have; udp only through b).
			name: "local first", src: Sources{Self: "a", Gateway: gw, Local: local, Listen: map[string]int32{
				TunnelName("a", "b", "ns", "hello", corev1.ProtocolTCP, 42): 40000,
				TunnelName("a", "b", "ns", "hello", corev1.ProtocolUDP, 42): 40001}},
			want: []string{"a:active:tcp/42", "b:active:udp/40001", "b:standby:tcp/40000"},
		},
		{
			// A Tunnel the exporter does not hold yet is not used.
			name: "exit not ready", src: Sources{Self: "a", Gateway: gw, Local: local},
			want: []string{"a:active:tcp/42"},
		},
		{
			name: "down", src: Sources{Self: "a", Gateway: gw, Down: map[string]bool{"b": true}, Listen: map[string]int32{
				TunnelName("a", "b", "ns", "hello", corev1.ProtocolUDP, 42): 40001}},
			want: nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := view(EndpointSlices(s, tc.src)); !slices.Equal(got, tc.want) {
				t.Errorf("slices %v, want %v", got, tc.want)
			}
		})
	}

	three := threeExporters()
	for _, tc := range []struct {
		name string
		cost map[string]time.Duration
		down map[string]bool
		want []string
	}{
		{name: "distances unknown: both", want: []string{"a:active:tcp/40000,udp/40001", "b:active:tcp/40002,udp/40003"}},
		{name: "a nearer", cost: map[string]time.Duration{"a": 30 * time.Millisecond, "b": 80 * time.Millisecond},
			want: []string{"a:active:tcp/40000,udp/40001", "b:standby:tcp/40002,udp/40003"}},
		{name: "within the margin", cost: map[string]time.Duration{"a": 30 * time.Millisecond, "b": 31 * time.Millisecond},
			want: []string{"a:active:tcp/40000,udp/40001", "b:active:tcp/40002,udp/40003"}},
		// The nearest cluster's relays stop answering: the other takes over.
		{name: "nearest down", cost: map[string]time.Duration{"a": 30 * time.Millisecond, "b": 80 * time.Millisecond}, down: map[string]bool{"a": true},
			want: []string{"b:active:tcp/40002,udp/40003"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := Sources{Self: "c", Gateway: gw, Cost: tc.cost, Down: tc.down, Listen: listenAll("c", three, 40000, 40001, 40002, 40003)}
			if got := view(EndpointSlices(three, src)); !slices.Equal(got, tc.want) {
				t.Errorf("slices %v, want %v", got, tc.want)
			}
		})
	}
}

// The import carries the MCS labels on every slice, belongs to its derived
// Service when it has a clusterset IP, and to none when headless.
func TestEndpointSlicesLabels(t *testing.T) {
	s := Merge([]*Report{hello("a", t0, nil)})[0]
	src := Sources{Self: "b", Gateway: []GatewayPod{{Address: "172.18.0.3", Ready: true}, {Address: "fd00::3", Ready: true}},
		Listen: map[string]int32{TunnelName("b", "a", "ns", "hello", corev1.ProtocolTCP, 42): 40000}}
	eps := EndpointSlices(s, src)
	if len(eps) != 2 || eps[0].AddressType != discoveryv1.AddressTypeIPv4 || eps[1].AddressType != discoveryv1.AddressTypeIPv6 {
		t.Fatalf("slices %+v", eps)
	}
	for _, e := range eps {
		for k, v := range map[string]string{mcsv1beta1.LabelServiceName: "hello", mcsv1beta1.LabelSourceCluster: "a",
			discoveryv1.LabelManagedBy: EndpointSliceManager, discoveryv1.LabelServiceName: DerivedName("hello")} {
			if e.Labels[k] != v {
				t.Errorf("%s: label %s=%q, want %q", e.Name, k, e.Labels[k], v)
			}
		}
	}

	h := Merge([]*Report{hello("a", t0, func(e *Export) {
		e.Type, e.Address = mcsv1beta1.Headless, ""
		e.Endpoints = []Endpoints{{AddressType: discoveryv1.AddressTypeIPv4,
			Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To(int32(42))}},
			Endpoints: []Endpoint{{Addresses: []string{"10.244.1.5"}, Hostname: "web-0", Ready: true}}}}
	})})[0]
	hs := EndpointSlices(h, Sources{Self: "b"})
	if len(hs) != 1 || hs[0].Labels[discoveryv1.LabelServiceName] != "" || ptr.Deref(hs[0].Endpoints[0].Hostname, "") != "web-0" ||
		hs[0].Labels[mcsv1beta1.LabelSourceCluster] != "a" {
		t.Errorf("headless slices %+v", hs)
	}
	if DerivedService(h) != nil {
		t.Error("a headless import has a derived Service")
	}
}

// Every cluster plans the same Chains and Tunnels; a cluster that lacks the
// namespace gets no Tunnels, and a port only its server's.
func TestPlanIsTheSameEverywhere(t *testing.T) {
	b := hello("b", t0.Add(time.Second), func(e *Export) {
		e.Ports = []mcsv1beta1.ServicePort{port("tcp2", corev1.ProtocolTCP, 4242)}
	})
	c := &Report{Cluster: "c", Gateway: "gw-c", Local: []string{"gw-c", "mid"}, Known: []string{"gw-a", "gw-b", "gw-c", "mid"}, Missing: []string{"ns/hello"}}
	a := hello("a", t0, nil)
	a.Known = append(a.Known, "gw-c", "mid")
	b.Known = append(b.Known, "gw-c", "mid")
	var first []string
	for _, order := range [][]*Report{{a, b, c}, {c, b, a}} {
		svcs := Merge(order)
		tunnels := Tunnels("edge", order, svcs)
		chains := Chains("edge", order)
		var got []string
		for _, t := range tunnels {
			got = append(got, t.Entry+">"+t.Source+" "+t.Annotations[AnnotationPort]+" "+t.Spec.Target+" "+t.Spec.Chain)
		}
		for _, ch := range chains {
			got = append(got, ch.Name+" "+ch.Spec.Entry+">"+ch.Spec.Exit+" via "+strings.Join(ch.Spec.Via, ","))
		}
		if first == nil {
			first = got
			continue
		}
		if !slices.Equal(got, first) {
			t.Errorf("another order of the reports plans\n%v\nnot\n%v", got, first)
		}
	}
	want := []string{"a>b TCP/4242 10.96.0.10:4242 " + ChainName("a", "b"), "b>a TCP/42 10.96.0.10:42 " + ChainName("b", "a"), "b>a UDP/42 10.96.0.10:42 " + ChainName("b", "a")}
	var tunnels []string
	for _, l := range first {
		if strings.Contains(l, ">") && strings.Contains(l, "10.96") {
			tunnels = append(tunnels, l)
		}
	}
	slices.Sort(tunnels)
	if !slices.Equal(tunnels, want) {
		t.Errorf("tunnels %v, want %v", tunnels, want)
	}
	// A Chain for every pair of clusters, through the relays every cluster
	// knows (gw-a, gw-b, gw-c and mid) but its own ends.
	var chains int
	for _, l := range first {
		if !strings.HasPrefix(l, "mcs-") {
			continue
		}
		chains++
		f := strings.Fields(l) // name entry>exit via relays
		ends := strings.Split(f[1], ">")
		var want []string
		for _, r := range []string{"gw-a", "gw-b", "gw-c", "mid"} {
			if r != ends[0] && r != ends[1] {
				want = append(want, r)
			}
		}
		if f[3] != strings.Join(want, ",") {
			t.Errorf("chain %s: via %s, want %v", f[0], f[3], want)
		}
	}
	if chains != 6 {
		t.Errorf("%d chains among 3 clusters, want 6", chains)
	}
}
