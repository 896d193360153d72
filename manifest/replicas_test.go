package manifest

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A sidecar relay's dual-stack Service has a slice per family; the
// addresses of one pod (targetRef) are one replica, dialed on both, and
// counted once. Not-ready addresses are left out; an address whose slice
// names no pod is a replica of its own.
func TestReplicasJoinAPodsFamilies(t *testing.T) {
	ep := func(pod string, ready bool, addrs ...string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
		}
		return e
	}
	slices4 := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
		ep("web-1", true, "10.244.1.7"), ep("web-0", true, "10.244.0.5"), ep("web-2", false, "10.244.2.9"), ep("", true, "10.244.3.3"),
	}}
	slices6 := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{
		ep("web-0", true, "fd00:10:244::5"), ep("web-1", true, "fd00:10:244:1::7"), ep("web-2", false, "fd00:10:244:2::9"),
	}}
	eps := []discoveryv1.EndpointSlice{slices6, slices4}
	want := []Replica{
		{Name: "10.244.3.3:7401", Endpoints: []string{"10.244.3.3:7401"}},
		{Name: "web-0", Endpoints: []string{"10.244.0.5:7401", "[fd00:10:244::5]:7401"}},
		{Name: "web-1", Endpoints: []string{"10.244.1.7:7401", "[fd00:10:244:1::7]:7401"}},
	}
	if got := Replicas(eps, 7401); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Replicas = %v, want %v", got, want)
	}
	flat := []string{"10.244.0.5:7401", "10.244.1.7:7401", "10.244.3.3:7401", "[fd00:10:244:1::7]:7401", "[fd00:10:244::5]:7401"}
	if got := ReadyReplicas(eps, 7401); !slices.Equal(got, flat) {
		t.Errorf("ReadyReplicas = %v, want %v", got, flat)
	}

	// A relay's copy of the cluster: dialed at every endpoint, replica by
	// replica; a sidecar relay of files has each endpoint a replica.
	rn := &v1alpha1.RelayNode{Spec: v1alpha1.RelayNodeSpec{Sidecar: &v1alpha1.RelaySidecar{}}}
	rn.Name = "web"
	files := &v1alpha1.RelayNode{Spec: v1alpha1.RelayNodeSpec{Sidecar: &v1alpha1.RelaySidecar{}, Endpoints: []string{"10.0.0.1:7401", "10.0.0.2:7401"}}}
	files.Name = "files"
	d := Dialed(rn, eps)
	set, problems := FromObjects([]v1alpha1.RelayNode{d, *files}, nil, nil)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	set.SetReplicas(map[string][]Replica{"web": Replicas(eps, 7401)})
	if got := set.Relay("web").Spec.Endpoints; !slices.Equal(got, flat) {
		t.Errorf("web's endpoints %v, want %v", got, flat)
	}
	if got := set.ReplicasOf("web"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ReplicasOf(web) = %v, want %v", got, want)
	}
	wantFiles := []Replica{{"10.0.0.1:7401", []string{"10.0.0.1:7401"}}, {"10.0.0.2:7401", []string{"10.0.0.2:7401"}}}
	if got := set.ReplicasOf("files"); fmt.Sprint(got) != fmt.Sprint(wantFiles) {
		t.Errorf("ReplicasOf(files) = %v, want %v", got, wantFiles)
	}
	if got := set.WithEndpoints(map[string][]string{"web": {"127.0.0.1:9"}}).ReplicasOf("web"); len(got) != 1 || got[0].Name != "127.0.0.1:9" {
		t.Errorf("with other endpoints, web's replicas are %v, want those endpoints", got)
	}
}

// One address is one relay, whatever names the slices give it: a pod's
// address listed again under another pod's name (a stale entry of the pod
// that had it before) or under none (a slice that names no pods) joins
// the replica it is already in, which keeps its pod's name. Counted as
// two, the one relay would take two replicas' share of the flows and
// hold two sets of links, and a drain would wait for both.
func TestReplicasShareNoAddress(t *testing.T) {
	ep := func(pod string, addrs ...string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
		}
		return e
	}
	eps := []discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
			ep("web-b", "10.244.0.5"), ep("web-c", "10.244.0.7"), ep("", "10.244.0.7"),
		}},
		{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{
			ep("web-b", "fd00::5"), ep("web-c", "fd00::7"),
		}},
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{ep("web-a", "10.244.0.5")}},
	}
	want := []Replica{
		{Name: "web-a", Endpoints: []string{"10.244.0.5:7401", "[fd00::5]:7401"}},
		{Name: "web-c", Endpoints: []string{"10.244.0.7:7401", "[fd00::7]:7401"}},
	}
	if got := Replicas(eps, 7401); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Replicas = %v, want %v", got, want)
	}
}
