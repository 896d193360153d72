package controllers

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/kube"
)

// Relays' Views (what relay/kube watches) follow the operator's member
// labels: a relay started before its RelayNode exists says so and waits;
// each relay of a Chain sees it with its Tunnel and its relays and no
// other relay does; a relay an edit adds sees the Chain, and one it takes
// out stops seeing it, with everything that came with it.
func TestRelayViewsFollowMembership(t *testing.T) {
	needAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // stops the Views' watches
	ns := namespace(t)
	a, b, c, d := "vw-a", "vw-b", "vw-c", "vw-d"
	views := map[string]*kube.View{}
	for _, n := range []string{a, b, c, d} {
		v, err := kube.NewView(kube.Options{Config: cfg, Namespace: ns, Name: n, CertsDir: "mounted", Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Start(ctx); err != nil {
			t.Fatal(err)
		}
		views[n] = v
	}
	// A first start: no RelayNode yet, so no label; the relay waits.
	if _, err := views[d].Manifests(ctx); err == nil || !strings.Contains(err.Error(), "is not in namespace") {
		t.Errorf("a relay without its RelayNode: %v", err)
	}
	relayNodes(t, ns, 7500, a, b, c, d)
	ch := chain(ns, "vw", a, b, c)
	create(t, ch)
	create(t, tunnel(ns, "vw", "vw", 9100))

	// route is the Chain's route in a relay's manifests (nil without it),
	// and what the relay caches.
	route := func(n string) ([]string, map[string]int, error) {
		set, err := views[n].Manifests(ctx)
		if err != nil {
			return nil, nil, err
		}
		cached, err := views[n].Cached(ctx)
		if err != nil {
			return nil, nil, err
		}
		if c := set.Chain(ns + "/vw"); c != nil {
			return manifest.Route(c), cached, nil
		}
		return nil, cached, nil
	}
	// want waits until each relay takes the route it should (nil: no
	// Chain) and caches that many RelayNodes (with the Chain and its
	// Tunnel, or neither).
	want := func(what string, routes map[string][]string, relays map[string]int) {
		t.Helper()
		eventually(t, what, func() error {
			for n, wantRoute := range routes {
				got, cached, err := route(n)
				if err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
				if !slices.Equal(got, wantRoute) {
					return fmt.Errorf("%s takes route %v, want %v", n, got, wantRoute)
				}
				has := 0
				if wantRoute != nil {
					has = 1
				}
				if cached["Chain"] != has || cached["Tunnel"] != has || cached["RelayNode"] != relays[n] {
					return fmt.Errorf("%s caches %v, want %d RelayNodes and %d Chain and Tunnel", n, cached, relays[n], has)
				}
			}
			return nil
		})
	}
	abc := []string{a, b, c}
	want("the Chain's relays see it, d only itself", map[string][]string{a: abc, b: abc, c: abc, d: nil},
		map[string]int{a: 3, b: 3, c: 3, d: 1})

	update(t, ch, func() { ch.Spec.Via, ch.Spec.Route = []string{b, d}, []string{a, b, d, c} })
	abdc := []string{a, b, d, c}
	want("d joins", map[string][]string{a: abdc, b: abdc, c: abdc, d: abdc}, map[string]int{a: 4, b: 4, c: 4, d: 4})

	update(t, ch, func() { ch.Spec.Via, ch.Spec.Route = []string{d}, []string{a, d, c} })
	adc := []string{a, d, c}
	want("b leaves", map[string][]string{a: adc, b: nil, c: adc, d: adc}, map[string]int{a: 3, b: 1, c: 3, d: 3})
}
