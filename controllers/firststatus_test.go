package controllers

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// writeCounter counts a fake client's writes by "resource verb", the
// resource with its subresource ("chains/status patch").
type writeCounter map[string]int

func (w writeCounter) funcs() interceptor.Funcs {
	kind := func(o client.Object) string {
		switch o.(type) {
		case *v1alpha1.Chain:
			return "chains"
		case *v1alpha1.Tunnel:
			return "tunnels"
		case *v1alpha1.RelayNode:
			return "relaynodes"
		case *corev1.Service:
			return "services"
		}
		return fmt.Sprintf("%T", o)
	}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			w[kind(o)+" create"]++
			return c.Create(ctx, o, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			w[kind(o)+" update"]++
			return c.Update(ctx, o, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			w[kind(o)+" patch"]++
			return c.Patch(ctx, o, p, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			w[kind(o)+"/"+sub+" patch"]++
			return c.SubResource(sub).Patch(ctx, o, p, opts...)
		},
	}
}

// firstStatusClient holds RelayNodes a, b, c (labelled for their Chain,
// not Ready), the Chain c1 over them, unlabelled, and what else is given.
func firstStatusClient(w writeCounter, objs ...client.Object) client.Client {
	abc := []string{"a", "b", "c"}
	for _, n := range abc {
		rn := relayNode("n", n)
		rn.Labels, _ = setMembers(nil, joined(abc))
		objs = append(objs, rn)
	}
	objs = append(objs, chain("n", "c1", abc...))
	return fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.RelayNode{}, &v1alpha1.Chain{}, &v1alpha1.Tunnel{}).
		WithIndex(&v1alpha1.Tunnel{}, indexTunnelChain, func(o client.Object) []string { return []string{o.(*v1alpha1.Tunnel).Spec.Chain} }).
		WithIndex(&v1alpha1.Chain{}, indexChainRelays, func(o client.Object) []string { return chainMembers(o.(*v1alpha1.Chain)) }).
		WithInterceptorFuncs(w.funcs()).Build()
}

// setReady gives an object's status the Ready condition of reason (True
// for the reasons that mean ready).
func setReady(t *testing.T, c client.Client, o client.Object, status metav1.ConditionStatus, reason string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatal(err)
	}
	cond := metav1.Condition{Type: conditionReady, Status: status, Reason: reason, Message: reason}
	switch v := o.(type) {
	case *v1alpha1.RelayNode:
		meta.SetStatusCondition(&v.Status.Conditions, cond)
	case *v1alpha1.Chain:
		meta.SetStatusCondition(&v.Status.Conditions, cond)
	}
	if err := c.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}
}

func reconcileOnce(t *testing.T, r interface {
	Reconcile(context.Context, ctrl.Request) (ctrl.Result, error)
}, name string) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "n", Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A new Chain is labelled for all its relays in one write, none joining
// (no relay runs it yet), and while its relays come up it writes no status:
// when they are Ready, its first status is Ready, one write. Without them
// for longer than the wait, it says so.
func TestNewChainOneLabelWriteOneStatusWrite(t *testing.T) {
	ctx := context.Background()
	w := writeCounter{}
	c := firstStatusClient(w)
	r := &ChainReconciler{Client: c, first: firstStatus{wait: time.Minute}}
	res := reconcileOnce(t, r, "c1")
	var ch v1alpha1.Chain
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	if got, want := memberValues(ch.Labels), joined([]string{"a", "b", "c"}); !maps.Equal(got, want) {
		t.Errorf("a new Chain's member labels %v, want %v: every relay joined at once", got, want)
	}
	if len(ch.Status.Conditions) != 0 {
		t.Errorf("a new Chain whose relays come up has conditions %v; want none yet", ch.Status.Conditions)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Minute {
		t.Errorf("requeued after %v; want within the wait, %v", res.RequeueAfter, time.Minute)
	}
	for _, n := range []string{"a", "b", "c"} {
		setReady(t, c, relayNode("n", n), metav1.ConditionTrue, ReasonRelaysReady)
	}
	reconcileOnce(t, r, "c1")
	reconcileOnce(t, r, "c1") // nothing left to write
	if c := waitCond(t, c, &ch); c.Reason != ReasonRouteReady {
		t.Errorf("Ready reason %s, want %s", c.Reason, ReasonRouteReady)
	}
	if want := (writeCounter{"chains patch": 1, "chains/status patch": 1}); !maps.Equal(w, want) {
		t.Errorf("writes %v, want %v", w, want)
	}

	// Its relays do not come up within the wait: it says why.
	w2 := writeCounter{}
	c2 := firstStatusClient(w2)
	r2 := &ChainReconciler{Client: c2, first: firstStatus{wait: 100 * time.Millisecond}}
	if res := reconcileOnce(t, r2, "c1"); res.RequeueAfter <= 0 || res.RequeueAfter > 100*time.Millisecond {
		t.Errorf("requeued after %v; want within 100ms", res.RequeueAfter)
	}
	time.Sleep(150 * time.Millisecond)
	reconcileOnce(t, r2, "c1")
	if c := waitCond(t, c2, &ch); c.Reason != ReasonRelayNotReady {
		t.Errorf("after the wait, Ready reason %s, want %s", c.Reason, ReasonRelayNotReady)
	}
}

// A new Chain does not wait for its Tunnels' labels (they reach its
// relays each in one write, as a new Tunnel's of a running Chain); a
// running Chain's edit does, as before.
func TestNewChainDoesNotWaitForItsTunnels(t *testing.T) {
	ctx := context.Background()
	c := firstStatusClient(writeCounter{}, tunnel("n", "t1", "c1", 9000))
	r := &ChainReconciler{Client: c}
	reconcileOnce(t, r, "c1")
	var ch v1alpha1.Chain
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	if got, want := memberValues(ch.Labels), joined([]string{"a", "b", "c"}); !maps.Equal(got, want) {
		t.Errorf("a new Chain with an unlabelled Tunnel: member labels %v, want %v", got, want)
	}

	abcd := []string{"a", "b", "c", "d"}
	d := relayNode("n", "d")
	d.Labels, _ = setMembers(nil, joined(abcd))
	c = firstStatusClient(writeCounter{}, d)
	r = &ChainReconciler{Client: c}
	reconcileOnce(t, r, "c1")
	for _, n := range abcd {
		var rn v1alpha1.RelayNode
		if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: n}, &rn); err != nil {
			t.Fatal(err)
		}
		rn.Labels, _ = setMembers(rn.Labels, joined(abcd))
		if err := c.Update(ctx, &rn); err != nil {
			t.Fatal(err)
		}
	}
	tn := tunnel("n", "t1", "c1", 9000)
	tn.Labels, _ = setMembers(nil, joined([]string{"a", "b", "c"})) // not d's yet
	if err := c.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	ch.Spec.Via, ch.Spec.Route = []string{"b", "d"}, []string{"a", "b", "d", "c"}
	if err := c.Update(ctx, &ch); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, "c1")
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	if v, ok := ch.Labels[v1alpha1.MemberLabel("d")]; ok {
		t.Errorf("d labelled %q on the edited Chain before its Tunnel carries d's label", v)
	}
}

// A Chain with relays labelled already is edited in two steps, as before:
// the relay an edit adds is joining first.
func TestEditedChainStillJoinsInTwoSteps(t *testing.T) {
	ctx := context.Background()
	w := writeCounter{}
	abcd := []string{"a", "b", "c", "d"}
	d := relayNode("n", "d")
	d.Labels, _ = setMembers(nil, joined(abcd))
	c := firstStatusClient(w, d)
	r := &ChainReconciler{Client: c}
	reconcileOnce(t, r, "c1")
	for _, n := range abcd {
		var rn v1alpha1.RelayNode
		if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: n}, &rn); err != nil {
			t.Fatal(err)
		}
		rn.Labels, _ = setMembers(rn.Labels, joined(abcd))
		if err := c.Update(ctx, &rn); err != nil {
			t.Fatal(err)
		}
	}
	var ch v1alpha1.Chain
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	ch.Spec.Via, ch.Spec.Route = []string{"b", "d"}, []string{"a", "b", "d", "c"}
	if err := c.Update(ctx, &ch); err != nil {
		t.Fatal(err)
	}
	if res := reconcileOnce(t, r, "c1"); res.RequeueAfter != joinDelay {
		t.Errorf("requeued after %v, want joinDelay", res.RequeueAfter)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "c1"}, &ch); err != nil {
		t.Fatal(err)
	}
	if v, ok := ch.Labels[v1alpha1.MemberLabel("d")]; !ok || v != v1alpha1.MemberJoining {
		t.Errorf("d's label %q (present %v) after the edit; want %q", v, ok, v1alpha1.MemberJoining)
	}
}

// A new Tunnel whose Chain is coming up writes its labels and Service but
// no status until the Chain is Ready; then Ready, one status write. One
// whose Chain is not ready for another reason says so at once.
func TestNewTunnelWaitsForItsChainQuietly(t *testing.T) {
	ctx := context.Background()
	w := writeCounter{}
	c := firstStatusClient(w, tunnel("n", "t1", "c1", 9000))
	r := &TunnelReconciler{Client: c, Scheme: Scheme(), Reports: newRelayReports(c, nil, nil), first: firstStatus{wait: time.Minute}}
	reconcileOnce(t, r, "t1")
	var tn v1alpha1.Tunnel
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "t1"}, &tn); err != nil {
		t.Fatal(err)
	}
	if len(tn.Status.Conditions) != 0 {
		t.Errorf("a new Tunnel whose Chain has no condition yet has conditions %v; want none yet", tn.Status.Conditions)
	}
	setReady(t, c, chain("n", "c1", "a"), metav1.ConditionFalse, ReasonRelayNotReady)
	reconcileOnce(t, r, "t1")
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "t1"}, &tn); err != nil {
		t.Fatal(err)
	}
	if len(tn.Status.Conditions) != 0 {
		t.Errorf("a new Tunnel whose Chain's relays come up has conditions %v; want none yet", tn.Status.Conditions)
	}
	setReady(t, c, chain("n", "c1", "a"), metav1.ConditionTrue, ReasonRouteReady)
	reconcileOnce(t, r, "t1")
	reconcileOnce(t, r, "t1")
	if c := waitCond(t, c, &tn); c.Reason != ReasonReady {
		t.Errorf("Ready reason %s, want %s", c.Reason, ReasonReady)
	}
	if w["tunnels/status patch"] != 1 || w["tunnels patch"] != 1 {
		t.Errorf("writes %v; want one status patch and one of its labels", w)
	}

	w2 := writeCounter{}
	c2 := firstStatusClient(w2, tunnel("n", "t1", "c1", 9000))
	setReady(t, c2, chain("n", "c1", "a"), metav1.ConditionFalse, ReasonRelayNotFound)
	r2 := &TunnelReconciler{Client: c2, Scheme: Scheme(), Reports: newRelayReports(c2, nil, nil), first: firstStatus{wait: time.Minute}}
	reconcileOnce(t, r2, "t1")
	if c := waitCond(t, c2, &tn); c.Reason != ReasonChainNotReady {
		t.Errorf("Ready reason %s, want %s at once: its Chain lacks a relay", c.Reason, ReasonChainNotReady)
	}
}

// waitCond reads o's Ready condition, failing without one.
func waitCond(t *testing.T, c client.Client, o client.Object) *metav1.Condition {
	t.Helper()
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatal(err)
	}
	var conds []metav1.Condition
	switch v := o.(type) {
	case *v1alpha1.Chain:
		conds = v.Status.Conditions
	case *v1alpha1.Tunnel:
		conds = v.Status.Conditions
	}
	cond := meta.FindStatusCondition(conds, conditionReady)
	if cond == nil {
		t.Fatalf("%s has no Ready condition", o.GetName())
	}
	return cond
}
