package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// After a large apply thousands of rechecks are queued; a Chain's spec
// edit, and a member label change, go before them, and a status change
// does not.
func TestUrgentBeforeBacklog(t *testing.T) {
	memberLabel := func(ch *v1alpha1.Chain) {
		ch.Labels = map[string]string{v1alpha1.MemberLabel("r1"): v1alpha1.MemberJoining}
	}
	for _, tc := range []struct {
		name   string
		urgent func(old, new client.Object) bool
		edit   func(ch *v1alpha1.Chain)
		want   bool
	}{
		{"spec edit", specOrMembers, func(ch *v1alpha1.Chain) { ch.Generation++ }, true},
		{"member label", specOrMembers, memberLabel, true},
		{"status only", specOrMembers, func(ch *v1alpha1.Chain) { ch.Status.ObservedGeneration++ }, false},
		// Its own kind (urgentSelf): only a user's edit; its member
		// labels are the operator's own write.
		{"own spec edit", specChanged, func(ch *v1alpha1.Chain) { ch.Generation++ }, true},
		{"own member label", specChanged, memberLabel, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := priorityqueue.New[reconcile.Request]("urgent-test-" + tc.name)
			defer q.ShutDown()
			h := urgentWhen(&handler.EnqueueRequestForObject{}, tc.urgent)
			const backlog = 100
			for i := range backlog {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("c%03d", i)}})
			}
			old := &v1alpha1.Chain{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "edited", Generation: 1, ResourceVersion: "1"}}
			edited := old.DeepCopy()
			edited.ResourceVersion = "2"
			tc.edit(edited)
			h.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: edited}, q)
			for deadline := time.Now().Add(5 * time.Second); q.Len() < backlog+1; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("queue holds %d", q.Len())
				}
			}
			first, _, _ := q.GetWithPriority()
			if got := first.Name == "edited"; got != tc.want {
				t.Errorf("first out of the queue: %s (urgent %v)", first.Name, tc.want)
			}
		})
	}
}

// A RelayNode's status moves with every relay pod and report; only its
// spec, member labels and readiness concern the Chains through it. The
// same for a Chain and its Tunnels.
func TestSpecMembersOrReady(t *testing.T) {
	ready := func(s metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: conditionReady, Status: s, Reason: "R"}}
	}
	base := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: 1}}
	base.Status.Conditions = ready(metav1.ConditionTrue)
	for _, tc := range []struct {
		name string
		edit func(rn *v1alpha1.RelayNode)
		want bool
	}{
		{"endpoints and counts", func(rn *v1alpha1.RelayNode) { rn.Status.Ready, rn.Status.Endpoints = 3, []string{"10.0.0.1:4000"} }, false},
		{"Ready message", func(rn *v1alpha1.RelayNode) { rn.Status.Conditions[0].Message = "3 of 3 relay pods ready" }, false},
		{"not Ready", func(rn *v1alpha1.RelayNode) { rn.Status.Conditions = ready(metav1.ConditionFalse) }, true},
		{"spec", func(rn *v1alpha1.RelayNode) { rn.Generation++ }, true},
		{"member label", func(rn *v1alpha1.RelayNode) { rn.Labels = map[string]string{v1alpha1.MemberLabel("x"): ""} }, true},
	} {
		n := base.DeepCopy()
		tc.edit(n)
		if got := specMembersOrReady(base, n); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Each kind's controller reconciles several objects at once.
func TestControllerWorkers(t *testing.T) {
	needAPI(t)
	want := map[string]float64{"chain": chainWorkers, "tunnel": tunnelWorkers, "relaynode": relayNodeWorkers}
	got := map[string]float64{}
	// The gauge is set as each controller starts.
	for deadline := time.Now().Add(30 * time.Second); len(got) < len(want) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = workers(t)
	}
	for c, n := range want {
		if n < 2 || got[c] != n {
			t.Errorf("controller %s: %v workers, want %v (more than one)", c, got[c], n)
		}
	}
}

// workers reads each started controller's MaxConcurrentReconciles.
func workers(t *testing.T) map[string]float64 {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "controller_runtime_max_concurrent_reconciles" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return got
}

// While a Chain's relays come up one by one, neither the Chain nor its
// Tunnels, not ready all along for the same reason, write anything until
// the Chain is Ready: no message that changes with each relay.
func TestQuietWhileRelaysComeUp(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	relays := relayNodes(t, ns, 7900, "q-hk", "q-sea", "q-la")
	ch := chain(ns, "quiet", "q-hk", "q-sea", "q-la")
	create(t, ch)
	tn := tunnel(ns, "quiet", "quiet", 8090)
	create(t, tn)
	waitReason(t, ch, "RelayNotReady")
	waitReason(t, tn, "ChainNotReady")
	waitJoined(t, ch)
	time.Sleep(time.Second) // the Tunnel's labels and Service are written
	_, mark := apiRequests.since(0)
	for i, rn := range relays[:2] {
		runRelayPod(t, rn, fmt.Sprintf("192.0.2.%d", 90+i))
		waitReason(t, rn, "RelaysReady")
	}
	time.Sleep(time.Second) // the Chain's and Tunnel's controllers had their chance
	reqs, _ := apiRequests.since(mark)
	for _, r := range reqs {
		if r.method != "GET" && (strings.Contains(r.path, "/tunnels/") || strings.Contains(r.path, "/chains/")) {
			t.Errorf("%s %s while the Chain was not ready all along", r.method, r.path)
		}
	}
	runRelayPod(t, relays[2], "192.0.2.92")
	waitReason(t, ch, "RouteReady")
	waitReason(t, tn, "Ready")
}

// A RelayNode's member labels change with each Chain it joins: only the
// Chains still publishing theirs, which wait for them, look again. Its
// readiness concerns every Chain through it.
func TestChainsOfRelay(t *testing.T) {
	named := func(name string, labels map[string]string) *v1alpha1.Chain {
		ch := chain("ns", name, "a", "b", "c")
		ch.Labels = labels
		return ch
	}
	settled := map[string]string{v1alpha1.MemberLabel("a"): "", v1alpha1.MemberLabel("b"): "", v1alpha1.MemberLabel("c"): ""}
	c := fake.NewClientBuilder().WithScheme(Scheme()).
		WithIndex(&v1alpha1.Chain{}, indexChainRelays, func(o client.Object) []string { return chainMembers(o.(*v1alpha1.Chain)) }).
		WithObjects(named("settled", settled), named("new", nil),
			named("joining", map[string]string{v1alpha1.MemberLabel("a"): "", v1alpha1.MemberLabel("b"): v1alpha1.MemberJoining, v1alpha1.MemberLabel("c"): ""})).
		Build()
	h := enqueueChainsOfRelay(c)
	old := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", Generation: 1, ResourceVersion: "1"}}
	for _, tc := range []struct {
		name string
		edit func(rn *v1alpha1.RelayNode)
		want []string
	}{
		{"member labels", func(rn *v1alpha1.RelayNode) { rn.Labels = settled }, []string{"joining", "new"}},
		{"Ready", func(rn *v1alpha1.RelayNode) {
			rn.Status.Conditions = []metav1.Condition{{Type: conditionReady, Status: metav1.ConditionTrue, Reason: "R"}}
		}, []string{"joining", "new", "settled"}},
	} {
		q := priorityqueue.New[reconcile.Request]("chains-of-relay-" + tc.name)
		n := old.DeepCopy()
		n.ResourceVersion = "2"
		tc.edit(n)
		h.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: n}, q)
		var got []string
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(got) < len(tc.want); {
			if q.Len() == 0 {
				time.Sleep(time.Millisecond)
				continue
			}
			r, _, _ := q.GetWithPriority()
			got = append(got, r.Name)
		}
		time.Sleep(50 * time.Millisecond)
		if q.Len() != 0 {
			t.Errorf("%s: more than %v queued", tc.name, got)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: queued %v, want %v", tc.name, got, tc.want)
		}
		q.ShutDown()
	}
}
