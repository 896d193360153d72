package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/observe"
)

// `status --kube` without rights to the CA Secret, whose key issues the
// observer's certificate, still reports: what the API says of each object,
// and why no relay was asked. Nothing it needs is a private key.
func TestStatusKubeWithoutTheCAKey(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	c := cluster.Start(t, "viewer")
	bin := procs.Hoplink(t)
	cluster.Create(t, c.K8s, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "hoplink-ca"}})
	cluster.Create(t, c.K8s, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "hk"},
		Spec: v1alpha1.RelayNodeSpec{Endpoints: []string{"127.0.0.1:1"}}})
	// A viewer of edge's hoplink objects, and nothing else.
	cluster.Create(t, c.K8s, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "viewer"}})
	cluster.Create(t, c.K8s, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"relaynodes", "chains", "tunnels"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceimports"}, Verbs: []string{"get", "list", "watch"}},
	}})
	cluster.Create(t, c.K8s, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "viewer"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "edge", Name: "viewer"}}})
	kc := cluster.RelayKubeconfig(t, c.Cfg, c.Dir, "edge", "viewer")

	// status exits 1 while anything is not ready, as this RelayNode (no
	// operator runs here); the report is on stdout either way.
	notReady := func(err error) bool {
		var ee *exec.ExitError
		return errors.As(err, &ee) && ee.ExitCode() == 1
	}
	out, err := exec.Command(bin, "status", "--kube", "--kubeconfig", kc, "--namespace", "edge", "-o", "json").Output()
	if err != nil && !notReady(err) {
		t.Fatalf("status --kube as a viewer: %v\n%s", err, out)
	}
	var r observe.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(r.RelaysNotAsked, "no rights to read --ca-secret") || len(r.Relays) != 0 ||
		len(r.API) != 1 || r.API[0].Name != "edge/hk" || r.Ready {
		t.Errorf("status --kube as a viewer: %s", out)
	}
	table, err := exec.Command(bin, "status", "--kube", "--kubeconfig", kc, "--namespace", "edge").Output()
	if err != nil && !notReady(err) || !strings.Contains(string(table), "relays not asked: no rights") || !strings.Contains(string(table), "RelayNode edge/hk") {
		t.Errorf("status --kube as a viewer, as a table: %v\n%s", err, table)
	}
	// An admin may ask for the same view; probe needs the relays and says so.
	out, err = exec.Command(bin, "status", "--kube", "--api-only", "--kubeconfig", c.Kubeconfig, "--namespace", "edge", "-o", "json").Output()
	if err != nil && !notReady(err) || !strings.Contains(string(out), `"relaysNotAsked": "--api-only`) {
		t.Errorf("status --kube --api-only: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "probe", "c", "--kube", "--kubeconfig", kc, "--namespace", "edge").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "relays not asked") {
		t.Errorf("probe as a viewer: %v\n%s", err, out)
	}
}
