package systest

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestTwoClusters runs a chain whose entry is in cluster A and whose exit is
// in cluster B, as docs/multi-cluster.md tells a user to set it up: one CA
// (B's operator uses a copy of A's), each cluster naming the other's relays
// by their endpoints as external RelayNodes, and the Chain and Tunnel in both.
func TestTwoClusters(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	bin := procs.Hoplink(t)
	ctx := context.Background()
	a := cluster.Start(t, "a")
	b := cluster.Start(t, "b")
	a.Operator(t, bin)

	// A's operator makes the CA; B's operator is given a copy.
	var ca corev1.Secret
	testutil.WaitFor(t, "cluster A's CA", func() error {
		return a.K8s.Get(ctx, types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}, &ca)
	})
	copyCA := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "hoplink-ca-from-a"}, Type: ca.Type, Data: ca.Data}
	cluster.Create(t, b.K8s, copyCA)
	b.Operator(t, bin, "--ca-secret", "hoplink-ca-from-a")

	echoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoLn.Close()
	go testutil.ServeSinkThenSource(echoLn)

	ports := map[string]int{"hk": testutil.FreePort(t), "seattle": testutil.FreePort(t), "useast": testutil.FreePort(t)}
	home := map[string]*cluster.Cluster{"hk": a, "seattle": a, "useast": b}
	for _, c := range []*cluster.Cluster{a, b} {
		for _, name := range []string{"hk", "seattle", "useast"} {
			rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: name}, Spec: v1alpha1.RelayNodeSpec{
				Listen:    v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(ports[name])},
				Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", ports[name])},
				External:  home[name] != c, // the other cluster's relay
			}}
			cluster.Create(t, c.K8s, rn)
		}
		cluster.Create(t, c.K8s, &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "to-east"}, Spec: v1alpha1.ChainSpec{
			Entry: "hk", Exit: "useast", Via: []string{"seattle"}, Route: []string{"hk", "seattle", "useast"}}})
	}
	webPort := testutil.FreePort(t)
	for _, c := range []*cluster.Cluster{a, b} {
		cluster.Create(t, c.K8s, &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "web"}, Spec: v1alpha1.TunnelSpec{
			Chain: "to-east", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(webPort)}, Target: echoLn.Addr().String()}})
	}
	a.Relay(t, bin, "hk")
	a.Relay(t, bin, "seattle")
	b.Relay(t, bin, "useast")

	webAddr := fmt.Sprintf("127.0.0.1:%d", webPort)
	testutil.WaitFor(t, "8 MiB through hk -> seattle (cluster A) -> useast (cluster B)", func() error {
		return testutil.TCPExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", webAddr, 5*time.Second) }, 8<<20)
	})

	// Each cluster's status says where its own relays stand: the relays
	// of the other cluster are external and have no pods here.
	for _, c := range []*cluster.Cluster{a, b} {
		for name, h := range home {
			var rn v1alpha1.RelayNode
			if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: name}, &rn); err != nil {
				t.Fatal(err)
			}
			if h != c && rn.Status.Desired != 0 {
				t.Errorf("cluster %s: external RelayNode %s wants %d relay pods", c.Name, name, rn.Status.Desired)
			}
		}
	}
}
