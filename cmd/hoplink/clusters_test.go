package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// cluster is one API server with its operator.
type cluster struct {
	name       string
	dir        string
	cfg        *rest.Config
	k8s        client.Client
	kubeconfig string
}

// startCluster starts an API server with hoplink's CRDs and the MCS API's,
// whose Services take their cluster IPs from serviceRange when one is given.
func startCluster(t *testing.T, name string, serviceRange ...string) *cluster {
	t.Helper()
	env := &envtest.Environment{CRDDirectoryPaths: []string{"../../config/crd/bases", "../../charts/hoplink/files/mcs-crds"}, ErrorIfCRDPathMissing: true}
	for _, r := range serviceRange {
		env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", r)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "hoplink-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{name: name, dir: filepath.Join(t.TempDir(), name), cfg: cfg}
	os.MkdirAll(c.dir, 0o755)
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := os.WriteFile(c.kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	if c.k8s, err = client.New(cfg, client.Options{Scheme: controllers.Scheme()}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"hoplink-system", "edge"} {
		// Relays on the host network, as a user allows them in a namespace.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"hoplink.dev/privileged-relays": "true"}}}
		if err := c.k8s.Create(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// run starts a hoplink process for this cluster, stopped when the test ends.
func (c *cluster) run(t *testing.T, bin, name string, args ...string) *exec.Cmd {
	t.Helper()
	logf := filepath.Join(c.dir, name+".log")
	cmd := startProcess(t, logf, bin, args...)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { waitProc(cmd); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(logf)
			t.Logf("--- cluster %s, %s log:\n%s", c.name, name, log)
		}
	})
	return cmd
}

func (c *cluster) operator(t *testing.T, bin string, args ...string) *exec.Cmd {
	return c.operatorLogged(t, bin, "operator", args...)
}

// operatorLogged starts an operator whose log is logName: an operator
// started again keeps the first one's log.
func (c *cluster) operatorLogged(t *testing.T, bin, logName string, args ...string) *exec.Cmd {
	return c.run(t, bin, logName, append([]string{"operator", "--kubeconfig", c.kubeconfig, "--namespace", "hoplink-system",
		"--relay-image", "hoplink:test", "--metrics-addr", "0", "--health-probe-addr", "0", "--webhook-port", "0"}, args...)...)
}

// relay runs a relay pod's process: as the ServiceAccount the operator made.
func (c *cluster) relay(t *testing.T, bin, name string) *exec.Cmd {
	kc := relayKubeconfig(t, c.cfg, c.dir, "edge", v1alpha1.RelayObjectName(name))
	return c.run(t, bin, "relay-"+name, "relay", "--kube", "--name", name, "--namespace", "edge", "--kubeconfig", kc)
}

// TestTwoClusters runs a chain whose entry is in cluster A and whose exit is
// in cluster B, as docs/multi-cluster.md tells a user to set it up: one CA
// (B's operator uses a copy of A's), each cluster naming the other's relays
// by their endpoints as external RelayNodes, and the Chain and Tunnel in both.
func TestTwoClusters(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	bin := buildHoplink(t)
	ctx := context.Background()
	a := startCluster(t, "a")
	b := startCluster(t, "b")
	a.operator(t, bin)

	// A's operator makes the CA; B's operator is given a copy.
	var ca corev1.Secret
	waitFor(t, "cluster A's CA", func() error {
		return a.k8s.Get(ctx, types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}, &ca)
	})
	copyCA := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "hoplink-ca-from-a"}, Type: ca.Type, Data: ca.Data}
	create(t, b.k8s, copyCA)
	b.operator(t, bin, "--ca-secret", "hoplink-ca-from-a")

	echoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoLn.Close()
	go serveSinkThenSource(echoLn)

	ports := map[string]int{"hk": testutil.FreePort(t), "seattle": testutil.FreePort(t), "useast": testutil.FreePort(t)}
	home := map[string]*cluster{"hk": a, "seattle": a, "useast": b}
	for _, c := range []*cluster{a, b} {
		for _, name := range []string{"hk", "seattle", "useast"} {
			rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: name}, Spec: v1alpha1.RelayNodeSpec{
				Listen:    v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(ports[name])},
				Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", ports[name])},
				External:  home[name] != c, // the other cluster's relay
			}}
			create(t, c.k8s, rn)
		}
		create(t, c.k8s, &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "to-east"}, Spec: v1alpha1.ChainSpec{
			Entry: "hk", Exit: "useast", Via: []string{"seattle"}, Route: []string{"hk", "seattle", "useast"}}})
	}
	webPort := testutil.FreePort(t)
	for _, c := range []*cluster{a, b} {
		create(t, c.k8s, &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "web"}, Spec: v1alpha1.TunnelSpec{
			Chain: "to-east", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(webPort)}, Target: echoLn.Addr().String()}})
	}
	a.relay(t, bin, "hk")
	a.relay(t, bin, "seattle")
	b.relay(t, bin, "useast")

	webAddr := fmt.Sprintf("127.0.0.1:%d", webPort)
	waitFor(t, "8 MiB through hk -> seattle (cluster A) -> useast (cluster B)", func() error {
		return tcpExchange(func() (net.Conn, error) { return net.DialTimeout("tcp", webAddr, 5*time.Second) }, 8<<20)
	})

	// Each cluster's status says where its own relays stand: the relays
	// of the other cluster are external and have no pods here.
	for _, c := range []*cluster{a, b} {
		for name, h := range home {
			var rn v1alpha1.RelayNode
			if err := c.k8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: name}, &rn); err != nil {
				t.Fatal(err)
			}
			if h != c && rn.Status.Desired != 0 {
				t.Errorf("cluster %s: external RelayNode %s wants %d relay pods", c.name, name, rn.Status.Desired)
			}
		}
	}
}
