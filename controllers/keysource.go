package controllers

import (
	"context"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// keySource hands namespace/name keys to a controller's work queue: a
// source.Source whose Add never blocks, however far the controller is
// behind (the queue folds repeated keys into one), and keeps what is added
// before the controller starts, or on a replica that does not lead.
type keySource struct {
	mu      sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[reconcile.Request]
	pending map[string]bool
}

func newKeySource() *keySource { return &keySource{pending: map[string]bool{}} }

// Add queues key (namespace/name).
func (s *keySource) Add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queue == nil {
		s.pending[key] = true
		return
	}
	s.queue.Add(request(key))
}

// Start is source.Source's: from now on keys go to queue.
func (s *keySource) Start(_ context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = queue
	for k := range s.pending {
		queue.Add(request(k))
	}
	s.pending = nil
	return nil
}

func (s *keySource) String() string { return "clusterset keys" }

func request(key string) reconcile.Request {
	ns, name, _ := strings.Cut(key, "/")
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
}
