package systest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/cluster"
	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestNamespaceScopedOperator runs the operator as a ServiceAccount that
// holds the operator's rules as Roles in two namespaces only (its own and
// edge), as the chart's operator.watchNamespaces installs it, and no
// ClusterRole: it serves edge's RelayNodes and leaves other namespaces'
// alone, without a permission error.
func TestNamespaceScopedOperator(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	c := cluster.Start(t, "scoped")
	ctx := context.Background()
	bin := procs.Hoplink(t)

	raw, err := os.ReadFile("../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var generated rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &generated); err != nil {
		t.Fatal(err)
	}
	cluster.Create(t, c.K8s, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	cluster.Create(t, c.K8s, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "hoplink-system", Name: "operator"}})
	for _, ns := range []string{"hoplink-system", "edge"} {
		cluster.Create(t, c.K8s, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hoplink-operator"}, Rules: generated.Rules})
		cluster.Create(t, c.K8s, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hoplink-operator"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "hoplink-operator"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "hoplink-system", Name: "operator"}}})
	}
	kc := cluster.RelayKubeconfig(t, c.Cfg, c.Dir, "hoplink-system", "operator")
	c.Run(t, bin, "operator", "operator", "--kubeconfig", kc, "--namespace", "hoplink-system", "--watch-namespaces", "edge",
		"--privileged-relays", "any", "--webhook-port", "0", "--relay-image", "hoplink:test",
		"--metrics-addr", "0", "--health-probe-addr", "0")

	for _, ns := range []string{"edge", "other"} {
		cluster.Create(t, c.K8s, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r-" + ns},
			Spec: v1alpha1.RelayNodeSpec{HostNetwork: ptr.To(true)}})
	}
	testutil.WaitFor(t, "edge's relay DaemonSet and Ready condition", func() error {
		var ds appsv1.DaemonSet
		if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: v1alpha1.RelayObjectName("r-edge")}, &ds); err != nil {
			return err
		}
		var rn v1alpha1.RelayNode
		if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "edge", Name: "r-edge"}, &rn); err != nil {
			return err
		}
		if len(rn.Status.Conditions) == 0 || rn.Status.CertificateNotAfter == nil {
			return fmt.Errorf("status %+v", rn.Status)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // had it watched other, it would have acted by now
	var rn v1alpha1.RelayNode
	if err := c.K8s.Get(ctx, types.NamespacedName{Namespace: "other", Name: "r-other"}, &rn); err != nil {
		t.Fatal(err)
	}
	if len(rn.Status.Conditions) != 0 {
		t.Errorf("a RelayNode outside the watched namespaces got a status: %+v", rn.Status)
	}
	log, _ := os.ReadFile(c.Dir + "/operator.log")
	if strings.Contains(string(log), "forbidden") {
		t.Errorf("the namespace-scoped operator hit a permission it does not have:\n%s", log)
	}
}
