package controllers

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// A reconcile that finds an object as it was before the operator's own
// last write (the cache has not delivered it) and would write the same
// again writes nothing; anything else it would write, it writes, and so
// does one that finds the object moved on.
func TestOwnWriteNotRepeatedOverAStaleCache(t *testing.T) {
	ctx := context.Background()
	w := writeCounter{}
	tn := tunnel("n", "stale", "c1", 9000)
	tn.UID = "uid-stale"
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(tn).WithStatusSubresource(tn).
		WithInterceptorFuncs(w.funcs()).Build()
	var cached v1alpha1.Tunnel
	if err := c.Get(ctx, types.NamespacedName{Namespace: "n", Name: "stale"}, &cached); err != nil {
		t.Fatal(err)
	}
	ready := func(o *v1alpha1.Tunnel, reason string) *v1alpha1.TunnelStatus {
		s := o.Status.DeepCopy()
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: conditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: reason})
		return s
	}
	members := joined([]string{"a", "b"})

	// First the labels, then the status, as a Tunnel's reconcile does.
	first := cached.DeepCopy()
	if err := patchMembers(ctx, c, first, members); err != nil {
		t.Fatal(err)
	}
	between := first.DeepCopy() // what the labels' watch event brings
	if err := patchStatus(ctx, c, first, &first.Status, ready(first, ReasonReady)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // a later transition time, in whole seconds

	// Reconciles from stale copies: before both writes, between them.
	if err := patchMembers(ctx, c, cached.DeepCopy(), members); err != nil {
		t.Fatal(err)
	}
	stale := between.DeepCopy()
	if err := patchStatus(ctx, c, stale, &stale.Status, ready(stale, ReasonReady)); err != nil {
		t.Fatal(err)
	}
	if want := (writeCounter{"tunnels patch": 1, "tunnels/status patch": 1}); !maps.Equal(w, want) {
		t.Errorf("writes %v, want %v: the same writes again over the versions they were made over", w, want)
	}

	// Something else to write over the stale copy: written.
	stale = between.DeepCopy()
	if err := patchStatus(ctx, c, stale, &stale.Status, ready(stale, ReasonLoopbackListen)); err != nil {
		t.Fatal(err)
	}
	if w["tunnels/status patch"] != 2 {
		t.Errorf("writes %v: a different status over a stale copy was not written", w)
	}
	// Another object of the same name (another UID): written.
	other := between.DeepCopy()
	other.UID = "uid-other"
	if alreadyWritten(other, "status", ready(other, ReasonLoopbackListen)) {
		t.Error("a write to another object of the name counted as this one's")
	}
}

// A RelayNode's pods come from the cache's index by their relay label, or
// by label from a reader without it; either way exactly its own.
func TestRelayPodsByIndexOrLabel(t *testing.T) {
	ctx := context.Background()
	pod := func(name, relay string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: name, Labels: map[string]string{LabelRelayNode: relay}}}
	}
	objs := []client.Object{pod("a-1", "a"), pod("a-2", "a"), pod("b-1", "b"), pod("other", "")}
	index := func(o client.Object) []string {
		if r := o.GetLabels()[LabelRelayNode]; r != "" {
			return []string{r}
		}
		return nil
	}
	indexed := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).WithIndex(&corev1.Pod{}, indexPodRelay, index).Build()
	plain := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).Build()
	for name, c := range map[string]client.Reader{"indexed": indexed, "plain": plain} {
		pods, err := relayPods(ctx, c, "n", "a")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range pods.Items {
			got = append(got, p.Name)
		}
		if slices.Sort(got); !slices.Equal(got, []string{"a-1", "a-2"}) {
			t.Errorf("%s reader: pods %v, want a-1 a-2", name, got)
		}
	}
}
