package kube

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// What relay a takes of the Chains its label selected: a Chain whose labels
// name every relay of its spec, none joining; an edited one whose labels
// lag, or name a new relay still joining, runs as a last took it, or not at
// all when a never had it; a Tunnel goes with its Chain, and one whose
// Chain a does not take is not its own. Relay d, joining, takes the edit
// first; a relay an edit took out keeps the Chain as it was.
func TestLabelled(t *testing.T) {
	chain := func(name string, members map[string]string, route ...string) v1alpha1.Chain {
		c := v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{}},
			Spec: v1alpha1.ChainSpec{Entry: route[0], Exit: route[len(route)-1], Via: route[1 : len(route)-1], Route: route}}
		for m, v := range members {
			c.Labels[v1alpha1.MemberLabel(m)] = v
		}
		return c
	}
	all := func(names ...string) map[string]string {
		m := map[string]string{}
		for _, n := range names {
			m[n] = ""
		}
		return m
	}
	joining := func(m map[string]string, names ...string) map[string]string {
		for _, n := range names {
			m[n] = v1alpha1.MemberJoining
		}
		return m
	}
	tunnel := func(name, chain string) v1alpha1.Tunnel {
		return v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: v1alpha1.TunnelSpec{Chain: chain}}
	}
	last := map[string]*v1alpha1.Chain{}
	for _, c := range []v1alpha1.Chain{
		chain("edited", all("a", "b", "c"), "a", "b", "c"),
		chain("joined", all("a", "b", "c"), "a", "b", "c"),
		chain("left", all("a", "b", "c"), "a", "b", "c"),
	} {
		last["ns/"+c.Name] = &c
	}
	chains := []v1alpha1.Chain{
		chain("steady", all("a", "c"), "a", "c"),
		// d added to the route; the operator has not labelled for it yet.
		chain("edited", all("a", "b", "c"), "a", "b", "d", "c"),
		// d added and labelled, still joining.
		chain("joined", joining(all("a", "b", "c"), "d"), "a", "b", "d", "c"),
		// New: every relay joining, the entry too.
		chain("new", joining(all(), "a", "d"), "a", "d"),
		chain("new-middle", joining(all(), "x", "a", "d"), "x", "a", "d"),
		// b taken out; its label goes a moment later.
		chain("left", all("a", "b", "c"), "a", "c"),
	}
	tunnels := []v1alpha1.Tunnel{tunnel("t1", "steady"), tunnel("t2", "edited"), tunnel("t3", "new"), tunnel("t4", "elsewhere"), tunnel("t5", "new-middle")}
	takes := func(self string, last map[string]*v1alpha1.Chain) (map[string][]string, []string, []string) {
		gotC, gotT, waiting := labelled(self, chains, tunnels, last)
		routes := map[string][]string{}
		for _, c := range gotC {
			routes[c.Name] = c.Spec.Route
		}
		var names []string
		for _, tn := range gotT {
			names = append(names, tn.Name)
		}
		return routes, names, waiting
	}
	routes, names, waiting := takes("a", last)
	want := map[string][]string{"steady": {"a", "c"}, "edited": {"a", "b", "c"}, "joined": {"a", "b", "c"}, "left": {"a", "c"},
		"new-middle": {"x", "a", "d"}}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("a takes %v, want %v", routes, want)
	}
	if !reflect.DeepEqual(names, []string{"t1", "t2", "t5"}) {
		t.Errorf("a takes tunnels %v, want [t1 t2 t5]", names)
	}
	if !reflect.DeepEqual(waiting, []string{"ns/edited", "ns/joined", "ns/new"}) {
		t.Errorf("a waits for %v", waiting)
	}
	// d, joining, takes the edit and the new Chains' spec before the entry
	// does; never having had edited, it waits for it.
	if routes, _, _ := takes("d", nil); !reflect.DeepEqual(routes["joined"], []string{"a", "b", "d", "c"}) || routes["new"] == nil || routes["edited"] != nil {
		t.Errorf("d takes %v", routes)
	}
	// b, taken out of left, keeps it as it was until its label goes.
	if routes, _, _ := takes("b", last); !reflect.DeepEqual(routes["left"], []string{"a", "b", "c"}) {
		t.Errorf("b takes %v", routes)
	}

	// Meanwhile b admits hops of the edits it waits for, of Chains it
	// runs: edited and joined, not new (it is not in it).
	var relays []v1alpha1.RelayNode
	for _, n := range []string{"a", "b", "c", "d", "x"} {
		relays = append(relays, v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: n},
			Spec: v1alpha1.RelayNodeSpec{Endpoints: []string{"127.0.0.1:1"}}})
	}
	gotC, _, waiting := labelled("b", chains, tunnels, last)
	set, problems := manifest.FromObjects(relays, gotC, nil)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	p := pending("b", chains, waiting, set)
	if len(p) != 2 || len(p["ns/edited"]) != 1 || len(p["ns/joined"]) != 1 ||
		!reflect.DeepEqual(p["ns/edited"][0].Chain.Spec.Route, []string{"a", "b", "d", "c"}) || !p["ns/edited"][0].Until.IsZero() {
		t.Errorf("b's pending versions: %v", p)
	}
	if !set.WithVersions(p).AdmitsHop(set.Chain("ns/edited"), "a", "b", []string{"b", "d", "c"}, time.Now()) {
		t.Error("b would refuse a flow along the edit a took first")
	}
	if set.AdmitsHop(set.Chain("ns/edited"), "a", "b", []string{"b", "d", "c"}, time.Now()) {
		t.Error("without its pending version b admits the edit's hop: the check above proves nothing")
	}
}

// listOnly is a cache whose lists come from a fake client.
type listOnly struct {
	cache.Cache
	r client.Reader
}

func (l listOnly) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return l.r.List(ctx, list, opts...)
}

// A relay started with a name its namespace lacks says which it has that
// is near; one whose RelayNode the operator has not labelled for it yet
// (its first start, or an older operator) says so, and waits.
func TestMissingRelayNodeSuggestsANear(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for _, n := range []string{"hk", "seattle"} {
		objs = append(objs, &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: n}})
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	// Nothing carries a member label, so the cache holds nothing.
	empty := listOnly{r: fake.NewClientBuilder().WithScheme(scheme).Build()}
	view := func(name string) *View {
		return &View{o: Options{Namespace: "edge", Name: name, Log: slog.New(slog.DiscardHandler)}, cache: empty, api: api}
	}
	_, err := view("seatle").Manifests(context.Background())
	if err == nil || !strings.Contains(err.Error(), `RelayNode seatle is not in namespace edge`) || !strings.HasSuffix(err.Error(), `; did you mean "seattle"?`) {
		t.Errorf("err %v", err)
	}
	_, err = view("hk").Manifests(context.Background())
	if err == nil || !strings.Contains(err.Error(), `RelayNode hk does not carry label member.hoplink.dev/hk yet`) {
		t.Errorf("err %v", err)
	}
}
