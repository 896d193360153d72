package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/testing/readme"
)

// A first RelayNode written from the API reference, in a namespace nobody
// labelled, as a new user's would be: it is refused, and every place the
// user looks first says so and names the command that fixes it (the
// condition, `kubectl get relaynodes`, a Warning Event); after that
// command it runs, or says what else to do. The README's sample of
// `kubectl get relaynodes` is this test's table.
func TestRelayNodeFromTheAPIReference(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n## RelayNode\n.*?```yaml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/api.md has no yaml example under ## RelayNode")
	}
	var rn v1alpha1.RelayNode
	if err := yaml.UnmarshalStrict(m[1], &rn); err != nil {
		t.Fatalf("docs/api.md's RelayNode: %v", err)
	}
	ns := "edge"
	mustCreateNamespaceWith(ctx, ns, nil)
	rn.Namespace = ns
	create(t, &rn)
	// The README's sample names the namespace edge: with -count above 1
	// the next run meets it again, unlabelled and without this relay.
	t.Cleanup(func() {
		k8s.Delete(ctx, &rn)
		var o corev1.Namespace
		if k8s.Get(ctx, types.NamespacedName{Name: ns}, &o) == nil {
			o.Labels = nil
			k8s.Update(ctx, &o)
		}
	})

	fix := "kubectl label namespace edge hoplink.dev/privileged-relays=true"
	eventually(t, "the refusal", func() error {
		c, err := readyCondition(&rn)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionFalse || c.Reason != ReasonPrivilegesNotAllowed || !strings.Contains(c.Message, fix) {
			return fmt.Errorf("Ready %s %s: %q; want False %s naming %q", c.Status, c.Reason, c.Message, ReasonPrivilegesNotAllowed, fix)
		}
		return nil
	})

	// kubectl get relaynodes: the API server's table from the CRD's
	// printer columns shows the reason without -o wide.
	tbl := relayNodeTable(t, ns)
	row := cellsOf(t, tbl, rn.Name)
	if row["Ready"] != "False" || row["Reason"] != ReasonPrivilegesNotAllowed {
		t.Errorf("kubectl get relaynodes shows %v; want Ready False, Reason %s", row, ReasonPrivilegesNotAllowed)
	}
	if msg, _ := row["Message"].(string); !strings.Contains(msg, fix) {
		t.Errorf("kubectl get relaynodes -o wide: message %q does not name %q", msg, fix)
	}
	// The README's sample is this table, but for its times.
	if err := checkTableSample("../README.md", "kubectl-get-rn-refused", "$ kubectl get relaynodes -n edge\n", renderTable(tbl)); err != nil {
		t.Error(err)
	}

	// A Warning Event with the same words, once: the rechecks every 30 s
	// do not repeat it.
	var warned []eventsv1.Event
	eventually(t, "the Warning Event", func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		warned = nil
		for _, e := range evs.Items {
			if e.Regarding.UID == rn.UID && e.Reason == ReasonPrivilegesNotAllowed {
				warned = append(warned, e)
			}
		}
		if len(warned) == 0 {
			return fmt.Errorf("no %s Event for %s among %d", ReasonPrivilegesNotAllowed, rn.Name, len(evs.Items))
		}
		return nil
	})
	if e := warned[0]; e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, fix) || len(warned) != 1 || (e.Series != nil && e.Series.Count > 1) {
		t.Errorf("Events %+v; want one Warning whose note names %q", warned, fix)
	}

	// The user runs the command and waits: namespaces are not watched,
	// the refusal is looked at again within policyRecheck.
	var nsObj corev1.Namespace
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns}, &nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = map[string]string{LabelPrivilegedRelays: "true"}
	if err := k8s.Update(ctx, &nsObj); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(policyRecheck + 15*time.Second)
	for {
		var ds appsv1.DaemonSet
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: RelayObjectName(rn.Name)}, &ds)
		c, cerr := readyCondition(&rn)
		// envtest runs no DaemonSet controller: no node runs the relay,
		// and the condition says what to check.
		if err == nil && cerr == nil && c.Reason == ReasonNoNodes && strings.Contains(c.Message, "spec.nodeSelector") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: DaemonSet %v, Ready %+v (%v)", fix, err, c, cerr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// relayNodeTable is what `kubectl get relaynodes -o wide` receives: the
// API server's Table, built from the CRD's printer columns.
func relayNodeTable(t *testing.T, ns string) *metav1.Table {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, strings.TrimRight(cfg.Host, "/")+"/apis/hoplink.dev/v1alpha1/namespaces/"+ns+"/relaynodes", nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("table: %s: %s", resp.Status, b)
	}
	var tbl metav1.Table
	if err := json.Unmarshal(b, &tbl); err != nil {
		t.Fatal(err)
	}
	return &tbl
}

// cellsOf is the row of name, by column name.
func cellsOf(t *testing.T, tbl *metav1.Table, name string) map[string]any {
	t.Helper()
	for _, r := range tbl.Rows {
		if len(r.Cells) > 0 && r.Cells[0] == name {
			cells := map[string]any{}
			for i, c := range tbl.ColumnDefinitions {
				cells[c.Name] = r.Cells[i]
			}
			return cells
		}
	}
	t.Fatalf("no row %s in %+v", name, tbl.Rows)
	return nil
}

// renderTable lays out tbl as kubectl does without -o wide: upper-case
// headers, three spaces between columns, dates as ages.
func renderTable(tbl *metav1.Table) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 6, 4, 3, ' ', 0)
	var cols []int
	var head []string
	for i, c := range tbl.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, i)
			head = append(head, strings.ToUpper(c.Name))
		}
	}
	fmt.Fprintln(w, strings.Join(head, "\t"))
	for _, r := range tbl.Rows {
		var cells []string
		for _, i := range cols {
			c := fmt.Sprint(r.Cells[i])
			if tbl.ColumnDefinitions[i].Type == "date" {
				if at, err := time.Parse(time.RFC3339, c); err == nil {
					c = duration.HumanDuration(time.Since(at))
				}
			}
			if c == "<nil>" || c == "" {
				c = "<none>"
			}
			cells = append(cells, c)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	w.Flush()
	return b.String()
}

// checkTableSample compares a README sample of a command and its table
// with the table now, but for the cells that are times (AGE, CERT
// EXPIRES), which differ from run to run; HOPLINK_UPDATE_DOCS=1 rewrites
// the sample from this run.
func checkTableSample(path, name, command, table string) error {
	want := command + table
	if readme.Updating() {
		return readme.Replace(path, name, want)
	}
	got, err := readme.Block(path, name)
	if err != nil {
		return err
	}
	// Row 0 is the command, row 1 the header; times differ every run.
	g, w := readme.Table(got), readme.Table(want)
	same := len(g) == len(w) && len(w) > 1
	for i := 0; same && i < len(w); i++ {
		same = len(g[i]) == len(w[i])
		for j := 0; same && j < len(w[i]); j++ {
			isTime := i > 1 && (w[1][j] == "AGE" || w[1][j] == "CERT EXPIRES")
			same = isTime || g[i][j] == w[i][j]
		}
	}
	if !same {
		return fmt.Errorf("%s: sample %q drifted.\n--- in the file:\n%s--- now:\n%s(rewrite it with %s=1 and the same test, then review the diff)", path, name, got, want, readme.UpdateEnv)
	}
	return nil
}
