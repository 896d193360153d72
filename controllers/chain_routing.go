package controllers

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/route"
	"github.com/hoplink/hoplink/routectl"
)

// routeWriter publishes the route controller's decisions: the route,
// latency and candidates in Chain status, and an Event on every change.
// Relays follow status.route, so a new route is written at once; the
// figures move a little every round, and live in metrics anyway, so
// otherwise the status is refreshed at most once a minute. That bounds the
// writes of an operator with many routed chains.
type routeWriter struct {
	client   client.Client
	api      client.Reader // uncached, to retry after a conflict
	recorder recorder.EventRecorder
	log      *slog.Logger

	mu      sync.Mutex
	written map[string]time.Time // chain key -> last status write
	failing map[string]bool      // chain key -> its last round found no route
}

// statusRefresh is the longest a routed chain's status goes without a
// write while its rounds succeed.
const statusRefresh = time.Minute

func (w *routeWriter) decided(d routectl.Decision) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, name, _ := strings.Cut(d.Chain, "/")
	key := types.NamespacedName{Namespace: ns, Name: name}
	w.noteFailure(ctx, key, d)
	if len(d.Route) == 0 {
		return
	}
	for attempt := range 2 {
		var ch v1alpha1.Chain
		reader := client.Reader(w.client)
		if attempt > 0 {
			reader = w.api
		}
		if err := reader.Get(ctx, key, &ch); err != nil {
			return // deleted; the reconciler stops its rounds
		}
		want := routingStatus(&ch, d)
		if !w.due(&ch, want, d) {
			return
		}
		orig := ch.DeepCopy()
		ch.Status = *want
		err := w.client.Status().Patch(ctx, &ch, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			continue // our cache lagged our own last write: read the API
		}
		if err != nil {
			w.log.Warn("cannot write chain status", "chain", d.Chain, "err", err)
			return
		}
		w.mu.Lock()
		w.written[d.Chain] = time.Now()
		w.mu.Unlock()
		if d.Changed {
			w.recorder.Eventf(&ch, nil, corev1.EventTypeNormal, "RouteChanged", "Route",
				"route %s (estimated %v, measured %v): %s", route.Key(d.Route), roundMs(d.Estimated), roundMs(d.Measured), d.Reason)
		}
		return
	}
}

// noteFailure records a Warning Event when a chain's rounds start finding
// no route, and forgets it when they find one again.
func (w *routeWriter) noteFailure(ctx context.Context, key types.NamespacedName, d routectl.Decision) {
	w.mu.Lock()
	was := w.failing[d.Chain]
	w.failing[d.Chain] = d.Err != nil
	w.mu.Unlock()
	if d.Err == nil || was {
		return
	}
	var ch v1alpha1.Chain
	if w.client.Get(ctx, key, &ch) == nil {
		w.recorder.Eventf(&ch, nil, corev1.EventTypeWarning, "NoRoute", "Route", "%v", d.Err)
	}
}

// forget drops what the writer remembers of a chain that is gone.
func (w *routeWriter) forget(chain string) {
	w.mu.Lock()
	delete(w.written, chain)
	delete(w.failing, chain)
	w.mu.Unlock()
}

// routingStatus is ch's status with this round's decision in it.
func routingStatus(ch *v1alpha1.Chain, d routectl.Decision) *v1alpha1.ChainStatus {
	s := ch.Status.DeepCopy()
	s.Route = slices.Clone(d.Route)
	s.Latency = latency(d.Estimated, d.Measured)
	s.Transports = slices.Clone(d.Transports)
	s.Candidates = nil
	for _, c := range d.Candidates[:min(len(d.Candidates), 9)] {
		s.Candidates = append(s.Candidates, v1alpha1.RouteCandidate{Route: c.Relays, Latency: *latency(c.Estimated, c.Measured)})
	}
	if d.Changed {
		now := metav1.Now()
		s.LastRouteChange = &now
		s.RouteChanges++
	}
	return s
}

// due says whether the new status is worth a write.
func (w *routeWriter) due(ch *v1alpha1.Chain, want *v1alpha1.ChainStatus, d routectl.Decision) bool {
	have := &ch.Status
	if d.Changed || !slices.Equal(have.Route, want.Route) || have.Latency == nil || fills(have, want) {
		return true
	}
	w.mu.Lock()
	last := w.written[d.Chain]
	w.mu.Unlock()
	return time.Since(last) > statusRefresh && !equality.Semantic.DeepEqual(have, want)
}

// fills says whether want has what have lacks: a latency figure or
// candidates that a first round had not measured yet (a link still coming
// up, a trace that missed its wait). Written at once, so that a new
// chain's status is complete within rounds rather than the refresh; a
// figure that goes missing again waits for the refresh, so a flapping
// figure cannot cost a write a round.
func fills(have, want *v1alpha1.ChainStatus) bool {
	if want.Latency != nil && have.Latency != nil &&
		(have.Latency.Estimated == nil && want.Latency.Estimated != nil || have.Latency.Measured == nil && want.Latency.Measured != nil) {
		return true
	}
	return len(want.Candidates) > len(have.Candidates)
}

// latency rounds figures to a tenth of a millisecond, which reads well in
// kubectl and is finer than any link's jitter.
func latency(estimated, measured time.Duration) *v1alpha1.RouteLatency {
	l := &v1alpha1.RouteLatency{}
	if estimated > 0 {
		l.Estimated = &metav1.Duration{Duration: estimated.Round(100 * time.Microsecond)}
	}
	if measured > 0 {
		l.Measured = &metav1.Duration{Duration: measured.Round(100 * time.Microsecond)}
	}
	return l
}

func roundMs(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
