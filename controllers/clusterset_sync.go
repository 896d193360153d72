package controllers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/clusterset"
)

// reportPublisher stores this cluster's report in the relays' namespace
// (ConfigMap v1alpha1.ClusterSetReportName), where the relays read it and
// serve it to the other clusters' operators. A report is stored only when
// it changed, under the next generation.
type reportPublisher struct {
	client client.Client
	api    client.Reader // the ConfigMap is not cached
	set    exchange
	log    *slog.Logger
}

func (p *reportPublisher) Start(ctx context.Context) error {
	key := types.NamespacedName{Namespace: p.set.ns, Name: v1alpha1.ClusterSetReportName}
	var gen int64
	var last [32]byte
	var cm corev1.ConfigMap
	if err := p.api.Get(ctx, key, &cm); err == nil {
		// Generations go on from the one stored: readers keep the highest.
		if r, err := clusterset.Decode(cm.BinaryData[v1alpha1.ClusterSetReportKey]); err == nil {
			gen = r.Generation
		}
	}
	retry := time.NewTimer(0)
	defer retry.Stop()
	var stored time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.set.publish:
		case <-retry.C:
		}
		// Let a burst of changes (an apply of many exports) settle, and
		// store at most one report per storeEvery: each is a write, and
		// every relay of the namespace reads it.
		select {
		case <-time.After(max(50*time.Millisecond, storeEvery-time.Since(stored))):
		case <-ctx.Done():
			return nil
		}
		r := p.set.Report()
		b, _ := json.Marshal(r)
		sum := sha256.Sum256(b)
		if sum == last {
			continue
		}
		r.Generation = gen + 1
		data, err := clusterset.Encode(r)
		if err == nil {
			err = p.store(ctx, key, data)
		}
		if err != nil {
			p.log.Error("cannot store the clusterset report; retrying", "configmap", key.String(), "err", err)
			retry.Reset(2 * time.Second)
			continue
		}
		gen, last, stored = r.Generation, sum, time.Now()
		p.set.Stored(r, gen)
	}
}

// storeEvery is the shortest time between two reports stored.
const storeEvery = 500 * time.Millisecond

func (p *reportPublisher) store(ctx context.Context, key types.NamespacedName, data []byte) error {
	var cm corev1.ConfigMap
	err := p.api.Get(ctx, key, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{labelManagedBy: managerName, clusterset.LabelManaged: "true"}},
			BinaryData: map[string][]byte{v1alpha1.ClusterSetReportKey: data}}
		return p.client.Create(ctx, &cm)
	}
	if err != nil {
		return err
	}
	if bytes.Equal(cm.BinaryData[v1alpha1.ClusterSetReportKey], data) {
		return nil
	}
	cm.BinaryData = map[string][]byte{v1alpha1.ClusterSetReportKey: data}
	cm.Data = nil
	return p.client.Update(ctx, &cm)
}

// reportPoller reads the other clusters' reports from their relays: every
// external RelayNode of the relays' namespace is another cluster's relay,
// asked over its admin API (mutual TLS: the operator's certificate, the
// relay's checked against the CAs this cluster trusts) with a wait, so a
// change arrives as soon as its cluster stored it. A report counts only
// when the relay that served it is among the cluster's own relays it names.
type reportPoller struct {
	client client.Reader
	api    *adminapi.Client
	set    exchange
	log    *slog.Logger

	mu      sync.Mutex
	polling map[string]context.CancelFunc
}

// pollWait is how long a read waits for a change before it asks again: a
// cluster whose relay went away silently is seen down after about this.
const pollWait = 10 * time.Second

func (p *reportPoller) Start(ctx context.Context) error {
	p.polling = map[string]context.CancelFunc{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var relays v1alpha1.RelayNodeList
		if err := p.client.List(ctx, &relays, client.InNamespace(p.set.ns)); err == nil {
			var names []string
			for _, rn := range relays.Items {
				if rn.Spec.External {
					names = append(names, rn.Name)
				}
			}
			p.set.Polling(names)
			p.mu.Lock()
			for _, n := range names {
				if p.polling[n] == nil {
					pctx, cancel := context.WithCancel(ctx)
					p.polling[n] = cancel
					wg.Add(1)
					go func() {
						defer wg.Done()
						p.poll(pctx, n)
					}()
				}
			}
			for n, cancel := range p.polling {
				if !slices.Contains(names, n) {
					cancel()
					delete(p.polling, n)
				}
			}
			p.mu.Unlock()
		}
		// Clusters that stopped answering are down from now on.
		p.set.Tick()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// poll reads relay's cluster's report until ctx ends.
func (p *reportPoller) poll(ctx context.Context, relay string) {
	var after, cluster string
	backoff := 250 * time.Millisecond
	var lastErr string
	for ctx.Err() == nil {
		var rn v1alpha1.RelayNode
		err := p.client.Get(ctx, types.NamespacedName{Namespace: p.set.ns, Name: relay}, &rn)
		if err == nil {
			err = errNoEndpoints
			for _, ep := range rn.Spec.Endpoints {
				var data []byte
				var version string
				var changed bool
				rctx, cancel := context.WithTimeout(ctx, pollWait+downAfter)
				data, version, changed, err = p.api.ClusterSet(rctx, relay, ep, after, pollWait)
				cancel()
				if err != nil {
					continue
				}
				if !changed {
					p.set.Answered(relay, cluster)
					break
				}
				var r *clusterset.Report
				if r, err = p.accept(relay, data); err != nil {
					break
				}
				after, cluster = version, r.Cluster
				p.set.SetRemote(relay, r, r.Generation)
				break
			}
		}
		if err == nil {
			backoff, lastErr = 250*time.Millisecond, ""
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if cluster != "" {
			p.set.Failed(relay, cluster)
		}
		if err.Error() != lastErr {
			lastErr = err.Error()
			p.log.Warn("cannot read another cluster's clusterset report from its relay; retrying", "relay", relay, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

type pollError string

func (e pollError) Error() string { return string(e) }

const errNoEndpoints = pollError("the RelayNode lists no spec.endpoints to reach it at")

// accept decodes a report and checks that the relay that served it may
// speak for its cluster.
func (p *reportPoller) accept(relay string, data []byte) (*clusterset.Report, error) {
	r, err := clusterset.Decode(data)
	switch {
	case err != nil:
		return nil, err
	case r.Cluster == p.set.self:
		return nil, pollError("relay " + relay + " speaks for cluster " + r.Cluster + ", which is this cluster's own ID: give each cluster its own (--cluster-id)")
	case !slices.Contains(r.Local, relay):
		return nil, pollError("relay " + relay + " served the report of cluster " + r.Cluster + ", which does not name it among its relays")
	case r.ClusterSet != "" && p.set.o.ClusterSet != "" && r.ClusterSet != p.set.o.ClusterSet:
		return nil, pollError("relay " + relay + " is of clusterset " + r.ClusterSet + ", not " + p.set.o.ClusterSet)
	}
	return r, nil
}
