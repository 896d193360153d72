// Package cluster runs a Kubernetes API server (envtest) with hoplink's
// CRDs and the MCS API's, and hoplink operator and relay processes against
// it, for tests of the binary in a cluster. Tests only.
package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// Cluster is one API server, with namespaces hoplink-system and edge, both
// allowing relays on the host network.
type Cluster struct {
	Name       string
	Dir        string // the logs of its processes, its kubeconfigs
	Cfg        *rest.Config
	K8s        client.Client
	Kubeconfig string // an admin's
}

// Start starts an API server with hoplink's CRDs and the MCS API's, whose
// Services take their cluster IPs from serviceRange when one is given; it
// stops when the test ends.
func Start(t *testing.T, name string, serviceRange ...string) *Cluster {
	t.Helper()
	root := testutil.Root(t)
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "config/crd/bases"), filepath.Join(root, "charts/hoplink/files/mcs-crds")}, ErrorIfCRDPathMissing: true}
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
	c := &Cluster{Name: name, Dir: filepath.Join(t.TempDir(), name), Cfg: cfg}
	os.MkdirAll(c.Dir, 0o755)
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	if c.K8s, err = client.New(cfg, client.Options{Scheme: controllers.Scheme()}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"hoplink-system", "edge"} {
		// Relays on the host network, as a user allows them in a namespace.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"hoplink.dev/privileged-relays": "true"}}}
		if err := c.K8s.Create(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// Run starts a hoplink process for this cluster, its output in Dir/name.log,
// stopped (SIGTERM, then SIGKILL after 10 s) when the test ends.
func (c *Cluster) Run(t *testing.T, bin, name string, args ...string) *exec.Cmd {
	t.Helper()
	logf := filepath.Join(c.Dir, name+".log")
	cmd := procs.Start(t, logf, bin, args...)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { procs.Wait(cmd); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(logf)
			t.Logf("--- cluster %s, %s log:\n%s", c.Name, name, log)
		}
	})
	return cmd
}

// Operator starts the operator, logging to operator.log.
func (c *Cluster) Operator(t *testing.T, bin string, args ...string) *exec.Cmd {
	return c.OperatorLogged(t, bin, "operator", args...)
}

// OperatorLogged starts an operator whose log is logName: an operator
// started again keeps the first one's log.
func (c *Cluster) OperatorLogged(t *testing.T, bin, logName string, args ...string) *exec.Cmd {
	return c.Run(t, bin, logName, append([]string{"operator", "--kubeconfig", c.Kubeconfig, "--namespace", "hoplink-system",
		"--relay-image", "hoplink:test", "--metrics-addr", "0", "--health-probe-addr", "0", "--webhook-port", "0"}, args...)...)
}

// Relay runs a relay pod's process for RelayNode edge/name: as the
// ServiceAccount the operator made.
func (c *Cluster) Relay(t *testing.T, bin, name string) *exec.Cmd {
	kc := RelayKubeconfig(t, c.Cfg, c.Dir, "edge", v1alpha1.RelayObjectName(name))
	return c.Run(t, bin, "relay-"+name, "relay", "--kube", "--name", name, "--namespace", "edge", "--kubeconfig", kc)
}

// Create creates o, or fails the test.
func Create(t *testing.T, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// RelayKubeconfig waits for a ServiceAccount (one the operator makes for a
// relay, say) and writes into dir a kubeconfig with a token of it.
func RelayKubeconfig(t *testing.T, cfg *rest.Config, dir, ns, sa string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var token string
	testutil.WaitFor(t, "token of ServiceAccount "+sa, func() error {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		token = tr.Status.Token
		return nil
	})
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["relay"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = "relay"
	path := filepath.Join(dir, sa+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
