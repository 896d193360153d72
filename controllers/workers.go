package controllers

import (
	"context"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// Workers per controller. Objects of a kind are independent (the queue
// never hands one key to two workers), and a reconcile spends most of its
// time waiting for the API server, so one worker a kind left the API
// server idle while 10,000 Chains queued behind each other. The client's
// rate limit, not the workers, bounds the writes. A RelayNode's reconcile
// waits for the most requests (its namespace, certificate, RBAC,
// workload, labels and status, one after another): with 4 workers, 1,000
// RelayNodes took 250 s to be Ready at issue 41's size while the
// operator's CPU stayed low, and every Chain waits for its relays.
const (
	chainWorkers     = 16
	tunnelWorkers    = 16
	relayNodeWorkers = 16
)

// urgentPriority is the queue priority of a change a user is waiting for:
// a spec edit, and the membership changes that carry it to the relays.
// Status-only changes (a relay's pod became ready, a report) keep the
// default, 0, so that after a large apply an edit is not queued behind
// thousands of rechecks.
const urgentPriority = 10

// urgentWhen wraps a handler so that the update events urgent picks enqueue
// with urgentPriority; other events as the handler would. Without a
// priority queue it changes nothing.
func urgentWhen(h handler.EventHandler, urgent func(old, new client.Object) bool) handler.EventHandler {
	return urgentHandler{h, urgent}
}

type urgentHandler struct {
	handler.EventHandler
	urgent func(old, new client.Object) bool
}

func (h urgentHandler) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok && h.urgent(e.ObjectOld, e.ObjectNew) {
		q = urgentQueue{pq}
	}
	h.EventHandler.Update(ctx, e, q)
}

// urgentQueue adds at urgentPriority at least.
type urgentQueue struct {
	priorityqueue.PriorityQueue[reconcile.Request]
}

func (q urgentQueue) raise(o priorityqueue.AddOpts) priorityqueue.AddOpts {
	if o.Priority == nil || *o.Priority < urgentPriority {
		p := urgentPriority
		o.Priority = &p
	}
	return o
}

func (q urgentQueue) AddWithOpts(o priorityqueue.AddOpts, items ...reconcile.Request) {
	q.PriorityQueue.AddWithOpts(q.raise(o), items...)
}
func (q urgentQueue) Add(r reconcile.Request) { q.AddWithOpts(priorityqueue.AddOpts{}, r) }
func (q urgentQueue) AddAfter(r reconcile.Request, after time.Duration) {
	q.AddWithOpts(priorityqueue.AddOpts{After: after}, r)
}
func (q urgentQueue) AddRateLimited(r reconcile.Request) {
	q.AddWithOpts(priorityqueue.AddOpts{RateLimited: true}, r)
}

// urgentSelf enqueues an object of the controller's own kind, again and at
// urgentPriority, when its spec changes: a user's edit (For enqueues it
// too, at the default priority; the queue keeps the higher). Not on its
// member labels, which the operator writes itself: re-reconciled urgently,
// every RelayNode whose labels a new Chain changed went before the
// RelayNodes not reconciled even once, whose DaemonSets then waited.
func urgentSelf() (handler.EventHandler, builder.WatchesOption) {
	return urgentWhen(&handler.EnqueueRequestForObject{}, specChanged),
		builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
			UpdateFunc:  func(e event.UpdateEvent) bool { return specChanged(e.ObjectOld, e.ObjectNew) },
		})
}

func specChanged(old, new client.Object) bool { return old.GetGeneration() != new.GetGeneration() }

// specOrMembers: the spec (generation) or the member labels changed, which
// is an edit and what relays are waiting for.
func specOrMembers(old, new client.Object) bool {
	return old.GetGeneration() != new.GetGeneration() || !maps.Equal(memberValues(old.GetLabels()), memberValues(new.GetLabels()))
}

// specMembersOrReady says whether an update of a RelayNode or Chain can
// change the objects that depend on it (the Chains through a RelayNode,
// the Tunnels of a Chain): its spec, its member labels (a Chain waits for
// its relays'; a Tunnel copies its Chain's) or whether it is Ready. The
// rest of their status moves with every relay pod, report and recheck
// (a Chain's message names the relays not ready yet), and each such write
// used to recheck every dependent, thirty Chains a RelayNode at issue 31's
// size, for nothing.
func specMembersOrReady(old, new client.Object) bool {
	return specOrMembers(old, new) || ready(old) != ready(new)
}

func ready(o client.Object) bool {
	switch o := o.(type) {
	case *v1alpha1.RelayNode:
		return meta.IsStatusConditionTrue(o.Status.Conditions, conditionReady)
	case *v1alpha1.Chain:
		return meta.IsStatusConditionTrue(o.Status.Conditions, conditionReady)
	}
	return false
}
