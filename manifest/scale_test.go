package manifest

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// BenchmarkFromObjectsTenThousandTunnels builds the manifests of a relay
// that enters 10,000 Tunnels, as relay/kube does on each burst of watch
// events (issue 31). Validation once compared every pair of an entry's
// listeners: 1.36 s here; keyed by port, tens of milliseconds.
func BenchmarkFromObjectsTenThousandTunnels(b *testing.B) {
	relay := func(name string, port int32) v1alpha1.RelayNode {
		return v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1alpha1.RelayNodeSpec{
			Listen: v1alpha1.RelayListen{Address: "127.0.0.1", Port: port}, Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", port)}}}
	}
	relays := []v1alpha1.RelayNode{relay("r0", 7000), relay("r1", 7001)}
	chains := []v1alpha1.Chain{{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Spec: v1alpha1.ChainSpec{Entry: "r0", Exit: "r1", Route: []string{"r0", "r1"}}}}
	var tunnels []v1alpha1.Tunnel
	for i := range 10000 {
		tunnels = append(tunnels, v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%05d", i), Namespace: "default"},
			Spec: v1alpha1.TunnelSpec{Chain: "c", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(20000 + i)}, Target: "127.0.0.1:80"}})
	}
	for b.Loop() {
		if _, problems := FromObjects(relays, chains, tunnels); len(problems) > 0 {
			b.Fatal(problems)
		}
	}
}
