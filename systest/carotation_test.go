package systest

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/pki"
)

// TestClusterCARotation rotates the operator's CA in the three steps the
// docs give (the CA Secret's ca.crt trusts both, the new CA signs, ca.crt
// trusts the new alone), restarting the operator after each, while a
// transfer crosses the chain: relays take each step from their Secrets
// without a restart, the transfer completes byte-exact, and relays
// restarted at the end (new handshakes, new CA only) carry flows.
func TestClusterCARotation(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	c := cluster.Start(t, "rot")
	ctx := context.Background()
	bin := procs.Hoplink(t)
	operator := c.Operator(t, bin)
	restartOperator := func() {
		operator.Process.Signal(syscall.SIGTERM)
		procs.Wait(operator)
		operator = c.Operator(t, bin)
	}

	target := testutil.SinkThenSource(t)
	for _, r := range []string{"hk", "la"} {
		p := testutil.FreePort(t)
		cluster.Create(t, c.K8s, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: r},
			Spec: v1alpha1.RelayNodeSpec{Listen: v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(p)}, Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", p)}}})
	}
	cluster.Create(t, c.K8s, &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "c"},
		Spec: v1alpha1.ChainSpec{Entry: "hk", Exit: "la", Route: []string{"hk", "la"}, Transport: v1alpha1.TransportQUIC}})
	port := testutil.FreePort(t)
	cluster.Create(t, c.K8s, &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "t"},
		Spec: v1alpha1.TunnelSpec{Chain: "c", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(port)}, Target: target}})
	relays := map[string]*exec.Cmd{}
	startRelay := func(name string) {
		kc := cluster.RelayKubeconfig(t, c.Cfg, c.Dir, "edge", v1alpha1.RelayObjectName(name))
		relays[name] = c.Run(t, bin, "relay-"+name, "relay", "--kube", "--name", name, "--namespace", "edge", "--kubeconfig", kc)
	}
	for _, r := range []string{"hk", "la"} {
		testutil.WaitFor(t, "the operator makes "+r+"'s ServiceAccount", func() error {
			return c.K8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: v1alpha1.RelayObjectName(r)}, &corev1.ServiceAccount{})
		})
		startRelay(r)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }
	testutil.WaitFor(t, "a flow through hk -> la", func() error { return testutil.TCPExchange(dial, 100000) })
	done := make(chan error, 1)
	go func() { done <- slowExchange(addr, 4<<20, 15*time.Second) }()

	caKey := types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}
	var caSecret corev1.Secret
	if err := c.K8s.Get(ctx, caKey, &caSecret); err != nil {
		t.Fatal(err)
	}
	oldCA := caSecret.Data["tls.crt"]
	next, err := pki.NewCA("next relay CA")
	if err != nil {
		t.Fatal(err)
	}
	nextKey, _ := next.KeyPEM()
	bundle := append(append([]byte{}, oldCA...), next.PEM...)
	// step writes the CA Secret, restarts the operator, and waits until
	// both relay Secrets hold ca.crt == trust and certificates of signer.
	step := func(name string, data map[string][]byte, trust []byte, signer []byte) {
		t.Helper()
		if err := c.K8s.Get(ctx, caKey, &caSecret); err != nil {
			t.Fatal(err)
		}
		for k, v := range data {
			caSecret.Data[k] = v
		}
		if err := c.K8s.Update(ctx, &caSecret); err != nil {
			t.Fatal(err)
		}
		restartOperator()
		for _, r := range []string{"hk", "la"} {
			testutil.WaitFor(t, name+": "+r+"'s Secret", func() error {
				var s corev1.Secret
				if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: v1alpha1.RelayObjectName(r)}, &s); err != nil {
					return err
				}
				if !bytes.Equal(s.Data["ca.crt"], trust) {
					return fmt.Errorf("ca.crt holds %d certificates", bytes.Count(s.Data["ca.crt"], []byte("BEGIN CERTIFICATE")))
				}
				return signedBy(s.Data["tls.crt"], signer)
			})
		}
		if err := testutil.TCPExchange(dial, 100000); err != nil {
			t.Fatalf("%s: a new flow: %v", name, err)
		}
	}
	step("1, trust both", map[string][]byte{"ca.crt": bundle}, bundle, oldCA)
	step("2, the new CA signs", map[string][]byte{"tls.crt": next.PEM, "tls.key": nextKey}, bundle, next.PEM)
	step("3, trust the new alone", map[string][]byte{"ca.crt": next.PEM}, next.PEM, next.PEM)

	if err := <-done; err != nil {
		t.Fatalf("the transfer open across the rotation: %v", err)
	}
	// New processes: they trust the new CA alone and present its
	// certificates; the network is whole.
	for _, r := range []string{"la", "hk"} {
		relays[r].Process.Signal(syscall.SIGTERM)
		procs.Wait(relays[r])
		startRelay(r)
	}
	testutil.WaitFor(t, "a flow through the restarted relays", func() error { return testutil.TCPExchange(dial, 100000) })
}

// signedBy checks that certPEM chains to the CA in caPEM.
func signedBy(certPEM, caPEM []byte) error {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return fmt.Errorf("no certificate")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
