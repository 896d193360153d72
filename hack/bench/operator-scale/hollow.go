package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/kube"
)

// hollow is a relay that watches what a real one watches (kube.View, so
// the same selectors) and builds its manifests on every change, as a real
// one does, but relays nothing. It counts the bytes the API server sends it
// and remembers when the watched Chain's route changed in its manifests.
type hollow struct {
	name  string
	view  *kube.View
	bytes atomic.Int64 // every response body, API discovery included
	objs  atomic.Int64 // the lists and watches of its namespace's objects
	chain string       // the Chain whose route is followed

	mu   sync.Mutex
	seen []took
}

// took is a route a relay's manifests held from at on (nil: no Chain).
type took struct {
	at    time.Time
	route []string
}

// startHollow starts a hollow relay for each name and returns once every
// one's caches are synced.
func startHollow(ctx context.Context, cfg *rest.Config, names []string, chain string) ([]*hollow, error) {
	var hs []*hollow
	for _, n := range names {
		h := &hollow{name: n, chain: chain}
		hc := rest.CopyConfig(cfg)
		hc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return counting{rt, &h.bytes, &h.objs} }
		// CertsDir: a relay of mounted certificates watches no Secret;
		// hollow relays need none.
		v, err := kube.NewView(kube.Options{Config: hc, Namespace: ns, Name: n, CertsDir: "hollow", Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		h.view = v
		hs = append(hs, h)
	}
	// Started together, as relays after an operator's rollout would be.
	var wg sync.WaitGroup
	errs := make([]error, len(hs))
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errs[i] = h.view.Start(ctx); errs[i] == nil {
				h.update(ctx)
				go h.loop(ctx)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// loop builds the manifests after each burst of changes, as kube.Relay does.
func (h *hollow) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.view.Changed():
		}
		h.update(ctx)
	}
}

func (h *hollow) update(ctx context.Context) {
	set, err := h.view.Manifests(ctx)
	if err != nil {
		return // not its turn yet; the next change
	}
	var route []string
	if c := set.Chain(h.chain); c != nil {
		route = manifest.Route(c)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.seen); n == 0 || !slices.Equal(h.seen[n-1].route, route) {
		h.seen = append(h.seen, took{time.Now(), route})
	}
}

// tookRoute says when, after since, the relay acted on route: its
// manifests held the Chain with that route, or for a relay route does not
// name, no longer held the Chain.
func (h *hollow) tookRoute(route []string, since time.Time) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	want := route
	if !slices.Contains(route, h.name) {
		want = nil
	}
	for _, t := range h.seen {
		if t.at.After(since) && slices.Equal(t.route, want) {
			return t.at, true
		}
	}
	return time.Time{}, false
}

// hollowRow is what a hollow relay received and holds.
type hollowRow struct {
	name   string
	chains int
	bytes  int64 // all
	objs   int64 // lists and watches of objects
	events int64
	cached map[string]int
}

func (h *hollow) row(ctx context.Context) hollowRow {
	cached, _ := h.view.Cached(ctx)
	return hollowRow{name: h.name, chains: cached["Chain"], bytes: h.bytes.Load(), objs: h.objs.Load(), events: h.view.Events(), cached: cached}
}

// counting counts the bytes of response bodies as they arrive (watch
// streams too): all of them, and apart those of the namespace's objects.
type counting struct {
	rt        http.RoundTripper
	all, objs *atomic.Int64
}

func (c counting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil {
		var objs *atomic.Int64
		if strings.Contains(req.URL.Path, "/namespaces/"+ns+"/") {
			objs = c.objs
		}
		resp.Body = &countingBody{resp.Body, c.all, objs}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	all, objs *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.all.Add(int64(n))
	if b.objs != nil {
		b.objs.Add(int64(n))
	}
	return n, err
}
