package observe

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A condition message is written by whoever may write status: hoplink
// status shows it as printable text, so it can neither drive the terminal
// nor forge the verdict line. Before, it was printed as written.
func TestConditionsArePrintedPrintable(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	forged := "\x1b]0;pwned\x07\x1b[2J\x1b[H\n\nready: every relay answers, every chain has a route whose links are up, every Tunnel listens"
	ch := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "c"},
		Spec:   v1alpha1.ChainSpec{Entry: "hk", Exit: "la", Route: []string{"hk", "la"}},
		Status: v1alpha1.ChainStatus{Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Bad\x1b[31m", Message: forged}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ch).WithStatusSubresource(ch).Build()
	_, objs, err := FromCluster(context.Background(), c, "default")
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{Time: time.Now()}
	r.WithAPI(objs)
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07") || !strings.Contains(out, `\x1b]0;pwned\x07`) {
		t.Fatalf("control characters reached the report, or were dropped unseen:\n%q", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ready:") {
			t.Fatalf("a condition forged the verdict line:\n%s", out)
		}
	}
}
