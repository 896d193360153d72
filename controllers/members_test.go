package controllers

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// Member labels say which relays read an object: a Chain's are the relays
// its spec names; its Tunnels' the same; a RelayNode's itself and the
// relays it shares Chains with. When an edit adds a relay to a Chain, the
// RelayNodes and Tunnels that relay needs carry its label before the Chain
// does (relays drop a Chain whose relays they cannot see); when an edit
// takes one out, the labels go. Nothing is written while nothing changes.
func TestMemberLabels(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	a, b, c, d, e := "ml-a", "ml-b", "ml-c", "ml-d", "ml-e"
	relayNodes(t, ns, 7400, a, b, c, d, e)
	ch := chain(ns, "ml", a, b, c)
	create(t, ch)
	tn := tunnel(ns, "ml", "ml", 9000)
	create(t, tn)
	rn := func(name string) *v1alpha1.RelayNode { return relayNode(ns, name) }
	expect := func(want map[client.Object][]string) {
		t.Helper()
		eventually(t, "member labels", func() error {
			for o, names := range want {
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
					return err
				}
				if got := memberValues(o.GetLabels()); !maps.Equal(got, joined(names)) {
					return fmt.Errorf("%T %s: members %v, want %v joined", o, o.GetName(), got, names)
				}
			}
			return nil
		})
	}
	abc := []string{a, b, c}
	expect(map[client.Object][]string{ch: abc, tn: abc, rn(a): abc, rn(b): abc, rn(c): abc, rn(d): {d}, rn(e): {e}})

	// From here, the revision at which each object first carried what a
	// relay gaining the Chain needs: resource versions are etcd's
	// revisions, one counter for every object.
	ww, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	first := map[string]int{}
	// When the Chain's label of d appeared with each value ("gone" once
	// it went).
	dSince := map[string]time.Time{}
	abcd := []string{a, b, c, d}
	for _, list := range []client.ObjectList{&v1alpha1.ChainList{}, &v1alpha1.TunnelList{}, &v1alpha1.RelayNodeList{}} {
		w, err := ww.Watch(wctx, list, client.InNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				o, ok := ev.Object.(client.Object)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				if _, isChain := o.(*v1alpha1.Chain); isChain && o.GetName() == "ml" {
					v, ok := o.GetLabels()[v1alpha1.MemberLabel(d)]
					if !ok {
						v = "gone"
					}
					mu.Lock()
					if _, seen := dSince[v]; !seen {
						dSince[v] = time.Now()
					}
					mu.Unlock()
				}
				if !hasMembers(o.GetLabels(), abcd) {
					continue
				}
				rv, _ := strconv.Atoi(o.GetResourceVersion())
				key := fmt.Sprintf("%T %s", o, o.GetName())
				mu.Lock()
				if _, seen := first[key]; !seen {
					first[key] = rv
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the watches are open

	// d joins the chain.
	update(t, ch, func() { ch.Spec.Via, ch.Spec.Route = []string{b, d}, []string{a, b, d, c} })
	expect(map[client.Object][]string{ch: abcd, tn: abcd, rn(a): abcd, rn(b): abcd, rn(c): abcd, rn(d): abcd, rn(e): {e}})
	eventually(t, "the watches saw every object labelled", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(first) < 6 {
			return fmt.Errorf("seen %v", first)
		}
		return nil
	})
	mu.Lock()
	chainAt := first["*v1alpha1.Chain ml"]
	for k, rv := range first {
		if k != "*v1alpha1.Chain ml" && rv > chainAt {
			t.Errorf("the Chain carried d's label at revision %d, before %s did (%d): a relay could see it without what it needs", chainAt, k, rv)
		}
	}
	// d joins first, and the others act on the edit a moment later.
	if j, ok := dSince[v1alpha1.MemberJoining]; !ok || dSince[""].Sub(j) < joinDelay-100*time.Millisecond {
		t.Errorf("d's label on the Chain: joining at %v, joined at %v; want joining for %v first", j, dSince[""], joinDelay)
	}
	mu.Unlock()

	// Steady: touching the objects writes nothing but the touches.
	time.Sleep(time.Second)
	before := apiWrites(t)
	for _, o := range []client.Object{ch, tn, rn(d)} {
		update(t, o, func() { o.SetAnnotations(map[string]string{"touched": "yes"}) })
	}
	time.Sleep(2 * time.Second)
	if w := apiWrites(t) - before; w != 3 {
		t.Errorf("%d API writes after touching a Chain, its Tunnel and a RelayNode; want 3 (the touches)", w)
	}

	// d leaves, and keeps its label a moment for the flows on their way
	// to it; the Tunnel moves to a Chain of its own relays.
	mu.Lock()
	delete(dSince, "gone") // before d joined
	mu.Unlock()
	update(t, ch, func() { ch.Spec.Via, ch.Spec.Route = []string{b}, abc })
	edited := time.Now()
	other := chain(ns, "ml-other", e, c)
	create(t, other)
	update(t, tn, func() { tn.Spec.Chain = "ml-other" })
	ce := []string{c, e}
	expect(map[client.Object][]string{ch: abc, other: ce, tn: ce, rn(a): abc, rn(b): abc, rn(c): {a, b, c, e}, rn(d): {d}, rn(e): ce})
	mu.Lock()
	if gone := dSince["gone"]; gone.Sub(edited) < joinDelay-100*time.Millisecond {
		t.Errorf("d's label left the Chain %v after the edit that took d out; want %v", gone.Sub(edited), joinDelay)
	}
	mu.Unlock()

	// A deleted Chain's Tunnels are no relay's.
	if err := k8s.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	expect(map[client.Object][]string{tn: nil, rn(c): abc, rn(e): {e}})
}

// waitJoined waits until a Chain's member labels name the relays of its
// spec, none joining: the operator writes nothing more for it.
func waitJoined(t *testing.T, ch *v1alpha1.Chain) {
	t.Helper()
	eventually(t, "Chain "+ch.Name+" labelled for its relays", func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(ch), ch); err != nil {
			return err
		}
		if got, want := memberValues(ch.Labels), joined(manifest.Named(ch)); !maps.Equal(got, want) {
			return fmt.Errorf("member labels %v, want %v", got, want)
		}
		return nil
	})
}

// update reads o, changes it and writes it back, again if another writer
// came between.
func update(t *testing.T, o client.Object, change func()) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
			return err
		}
		change()
		return k8s.Update(context.Background(), o)
	})
	if err != nil {
		t.Fatal(err)
	}
}
