package systest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/pki"
)

// TestRelaysTrustOnlyNamesTheirNamespaceHolds: namespace b holds relay name
// y; namespace a then makes a RelayNode y too (which loses the name) and
// names it as the entry of a Chain to its relay la, whose Tunnel reaches a
// target of a's. b's admin runs a relay with b's certificate for y and a's
// Chain and Tunnel copied into its manifests. a's la (a `relay --kube`
// process with its own Role) must not take that relay as its peer y:
//
//   - before the operator has looked at a's y (it is stopped), when nothing
//     says who holds the name;
//   - when a's y is given the status of a RelayNode that holds its name:
//     b's certificate names namespace b (the finding: a key of one
//     namespace taken as the next holder of its name in another).
//
// The same relay with a certificate for y of namespace a (the control) then
// carries la's flows, so the attack's path is real. Deleting a's y ends its
// open flow and refuses new ones within 10 s. A new a's y confirmed carries
// flows again; once the operator marks it NameConflict, even though its
// status still carries a certificate expiry, as a RelayNode that lost its
// name to one of the same second would, la refuses it.
func TestRelaysTrustOnlyNamesTheirNamespaceHolds(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	c := cluster.Start(t, "names")
	ctx := context.Background()
	bin := procs.Hoplink(t)
	for _, n := range []string{"a", "b"} {
		cluster.Create(t, c.K8s, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"hoplink.dev/privileged-relays": "true"}}})
	}
	operator := c.Operator(t, bin)
	target := testutil.SinkThenSource(t)
	yPort, laPort, tunnelPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	relayNode := func(ns, name string, port int) *v1alpha1.RelayNode {
		return &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.RelayNodeSpec{
			Listen: v1alpha1.RelayListen{Address: "127.0.0.1", Port: int32(port)}, Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", port)}}}
	}
	secret := func(ns, relay string) (*corev1.Secret, error) {
		var s corev1.Secret
		err := c.K8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.RelayObjectName(relay)}, &s)
		return &s, err
	}

	// b's y holds the name: it is the first, and it gets a certificate.
	bY := relayNode("b", "y", yPort)
	cluster.Create(t, c.K8s, bY)
	var bSecret *corev1.Secret
	testutil.WaitFor(t, "b's certificate for y", func() (err error) { bSecret, err = secret("b", "y"); return err })
	cluster.Create(t, c.K8s, relayNode("a", "la", laPort))
	testutil.WaitFor(t, "a's certificate for la", func() error { _, err := secret("a", "la"); return err })
	laConfig := cluster.RelayKubeconfig(t, c.Cfg, c.Dir, "a", v1alpha1.RelayObjectName("la"))

	// a's y, made while no operator runs, a second after b's at least
	// (two of one second would both lose the name).
	operator.Process.Signal(syscall.SIGTERM)
	procs.Wait(operator)
	time.Sleep(time.Until(bY.CreationTimestamp.Add(1100 * time.Millisecond)))
	aY := relayNode("a", "y", yPort)
	cluster.Create(t, c.K8s, aY)
	cluster.Create(t, c.K8s, &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "c"}, Spec: v1alpha1.ChainSpec{
		Entry: "y", Exit: "la", Route: []string{"y", "la"}}})
	cluster.Create(t, c.K8s, &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "t"}, Spec: v1alpha1.TunnelSpec{
		Chain: "c", Listen: &v1alpha1.TunnelListen{Address: "127.0.0.1", Port: int32(tunnelPort)}, Target: target}})
	// Labelled for their relays, as an operator does before it issues a
	// certificate (so la sees them, and only the name check decides).
	for _, o := range []struct {
		obj  client.Object
		name string
	}{{&v1alpha1.RelayNode{}, "y"}, {&v1alpha1.RelayNode{}, "la"}, {&v1alpha1.Chain{}, "c"}, {&v1alpha1.Tunnel{}, "t"}} {
		labelMembers(t, c.K8s, types.NamespacedName{Namespace: "a", Name: o.name}, o.obj, "la", "y")
	}

	laMetrics := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	c.Run(t, bin, "relay-la", "relay", "--kube", "--name", "la", "--namespace", "a", "--kubeconfig", laConfig,
		"--metrics-addr", laMetrics)
	testutil.WaitFor(t, "la ready", func() error {
		resp, err := http.Get("http://" + laMetrics + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})

	// b's relay y: b's certificate, a's Chain and Tunnel.
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	os.MkdirAll(certs, 0o700)
	for file, key := range map[string]string{"ca.crt": "ca.crt", "y.crt": corev1.TLSCertKey, "y.key": corev1.TLSPrivateKeyKey} {
		if err := os.WriteFile(filepath.Join(certs, file), bSecret.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// "y" quoted: YAML reads a bare y as true.
	manifests := fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: "y"}
spec: {listen: {address: 127.0.0.1, port: %[1]d}, endpoints: ["127.0.0.1:%[1]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[2]d}, endpoints: ["127.0.0.1:%[2]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {namespace: a, name: c}
spec: {entry: "y", exit: la, route: ["y", la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {namespace: a, name: t}
spec: {chain: c, listen: {address: 127.0.0.1, port: %[3]d}, target: %[4]q}
`, yPort, laPort, tunnelPort, target)
	if err := os.WriteFile(filepath.Join(dir, "squat.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	yOfB := c.Run(t, bin, "relay-y-of-b", "relay", "-f", filepath.Join(dir, "squat.yaml"), "--name", "y", "--certs", certs)
	tunnel := fmt.Sprintf("127.0.0.1:%d", tunnelPort)
	testutil.WaitFor(t, "b's relay y listens for a's Tunnel", func() error {
		conn, err := net.DialTimeout("tcp", tunnel, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	flow := func() error {
		return testutil.TCPExchange(func() (net.Conn, error) {
			conn, err := net.DialTimeout("tcp", tunnel, time.Second)
			if err != nil {
				return nil, err
			}
			return shortDeadline{conn.(*net.TCPConn)}, nil
		}, 64<<10)
	}
	refused := func(when string) {
		t.Helper()
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
			if err := flow(); err == nil {
				t.Fatalf("%s: la carried a flow of b's relay y to a's target", when)
			}
		}
	}
	laLog := func(want string) error {
		b, _ := os.ReadFile(filepath.Join(c.Dir, "relay-la.log"))
		if !strings.Contains(string(b), want) {
			return fmt.Errorf("la's log does not say %q", want)
		}
		return nil
	}

	refused("a's y not yet looked at by the operator")
	if err := laLog(`RelayNode \"y\": status.certificateNotAfter: not set`); err != nil {
		t.Error(err)
	}

	// a's y as the operator leaves a RelayNode that holds its name: la
	// still refuses b's relay, whose certificate is of namespace b.
	confirm := func() {
		t.Helper()
		if err := c.K8s.Get(ctx, client.ObjectKeyFromObject(aY), aY); err != nil {
			t.Fatal(err)
		}
		aY.Status.CertificateNotAfter = &metav1.Time{Time: time.Now().Add(time.Hour)}
		meta.SetStatusCondition(&aY.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoNodes", Message: "no node runs this relay yet"})
		if err := c.K8s.Status().Update(ctx, aY); err != nil {
			t.Fatal(err)
		}
	}
	confirm()
	refused("a's y confirmed, and y's certificate of namespace b")
	if err := laLog(`peer certificate is relay \"y\" of namespace \"b\"; this relay's peers are those of namespace \"a\"`); err != nil {
		t.Error(err)
	}

	// Control: the same relay with a certificate for y of namespace a,
	// as a's y would be issued, carries flows.
	var caSecret corev1.Secret
	if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "hoplink-system", Name: "hoplink-ca"}, &caSecret); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	aCert, aKey, err := ca.IssueIn("a", "y", pki.ClusterRelayValidity)
	if err != nil {
		t.Fatal(err)
	}
	aCerts := filepath.Join(dir, "certs-a")
	os.MkdirAll(aCerts, 0o700)
	for file, data := range map[string][]byte{"ca.crt": bSecret.Data["ca.crt"], "y.crt": aCert, "y.key": aKey} {
		if err := os.WriteFile(filepath.Join(aCerts, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	yOfB.Process.Signal(syscall.SIGTERM)
	procs.Wait(yOfB)
	c.Run(t, bin, "relay-y-of-a", "relay", "-f", filepath.Join(dir, "squat.yaml"), "--name", "y", "--certs", aCerts)
	testutil.WaitFor(t, "la carries the flow of a's y (the control)", flow)

	// Deleting a's y takes it out of la's peers: an open flow ends and new
	// ones are refused within 10 s.
	open, err := net.DialTimeout("tcp", tunnel, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Write(make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	open.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := open.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("the open flow ended before the RelayNode was deleted: %v", err)
	}
	if err := c.K8s.Delete(ctx, aY); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	open.SetReadDeadline(deleted.Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, open); isTimeout(err) {
		t.Fatal("the flow of a's y was still open 10 s after its RelayNode was deleted")
	}
	t.Logf("the open flow ended %v after the RelayNode was deleted", time.Since(deleted).Round(10*time.Millisecond))
	if err := flow(); err == nil {
		t.Fatal("la carried a new flow of y after a's y was deleted")
	}
	if time.Since(deleted) > 10*time.Second {
		t.Fatalf("refused only %v after the deletion", time.Since(deleted))
	}

	// a's y again, as before: made while no operator runs, labelled and
	// given a confirmed status; la carries the flows of a's certificate.
	aY = relayNode("a", "y", yPort)
	cluster.Create(t, c.K8s, aY)
	labelMembers(t, c.K8s, client.ObjectKeyFromObject(aY), &v1alpha1.RelayNode{}, "la", "y")
	confirm()
	testutil.WaitFor(t, "la carries the flow once a's new y is confirmed", flow)

	// The operator, back, marks a's y: it does not hold its name.
	c.OperatorLogged(t, bin, "operator-again")
	testutil.WaitFor(t, "a's y NameConflict", func() error {
		if err := c.K8s.Get(ctx, client.ObjectKeyFromObject(aY), aY); err != nil {
			return err
		}
		if r := meta.FindStatusCondition(aY.Status.Conditions, "Ready"); r == nil || r.Reason != v1alpha1.ReasonNameConflict {
			return fmt.Errorf("conditions %+v", aY.Status.Conditions)
		}
		return nil
	})
	testutil.WaitFor(t, "la refuses y once a's y is NameConflict", func() error {
		if flow() == nil {
			return errors.New("la carried a flow of y to a's target")
		}
		return nil
	})
	refused("a's y in NameConflict with the expiry of a certificate in its status")
	if err := laLog(`RelayNode \"y\": status: Ready is NameConflict`); err != nil {
		t.Error(err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// labelMembers gives the object at key the member labels of relays, as the
// operator would.
func labelMembers(t *testing.T, c client.Client, key types.NamespacedName, o client.Object, relays ...string) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("member labels on %T %s", o, key.Name), func() error {
		if err := c.Get(context.Background(), key, o); err != nil {
			return err
		}
		l := o.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		for _, r := range relays {
			l[v1alpha1.MemberLabel(r)] = ""
		}
		o.SetLabels(l)
		return c.Update(context.Background(), o)
	})
}

// shortDeadline bounds a flow that a relay neither carries nor refuses.
type shortDeadline struct{ *net.TCPConn }

func (c shortDeadline) SetDeadline(time.Time) error {
	return c.TCPConn.SetDeadline(time.Now().Add(5 * time.Second))
}
