// Package kube runs a relay inside Kubernetes: it watches the relay's
// RelayNode, the Chains and Tunnels of its namespace, the peers' published
// endpoints and its own certificate Secret, and applies every change to the
// running relay. New Tunnels open, deleted ones close, a route change
// applies to new flows, and a renewed certificate to new handshakes.
package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
)

// Options say which relay to run and against which API server.
type Options struct {
	Config    *rest.Config
	Namespace string
	Name      string // the RelayNode
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	MaxFlows  int
	// MaxFlowsPerTunnel and MaxFlowsPerSource are relay.Config's.
	MaxFlowsPerTunnel, MaxFlowsPerSource int
	// NoTUNOffload opens tun Tunnels' devices without offload.
	NoTUNOffload bool
}

// Relay is a relay driven by the Kubernetes API.
type Relay struct {
	o       Options
	cache   cache.Cache
	changed chan struct{}
	relay   atomic.Pointer[relay.Relay] // nil until the certificate and RelayNode exist

	certPEM  []byte   // the certificate the relay presents
	problems []string // the last manifest problems logged
}

// settle batches a burst of watch events (an apply of many objects) into one
// update of the relay.
const settle = 100 * time.Millisecond

// New prepares the watches; Run starts them.
func New(o Options) (*Relay, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := cache.New(o.Config, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			// Its own certificate, and no other Secret: that is all its RBAC allows.
			&corev1.Secret{}: {Field: fields.OneTermEqualSelector("metadata.name", v1alpha1.RelayObjectName(o.Name))},
		},
	})
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	o.Log = o.Log.With("relay", o.Name, "namespace", o.Namespace)
	return &Relay{o: o, cache: c, changed: make(chan struct{}, 1)}, nil
}

// Ready reports whether the relay runs with its listeners open.
func (k *Relay) Ready() bool {
	r := k.relay.Load()
	return r != nil && r.Ready()
}

// Run watches and relays until ctx ends, then closes the relay.
func (k *Relay) Run(ctx context.Context) error {
	poke := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	}
	for _, o := range []client.Object{&v1alpha1.RelayNode{}, &v1alpha1.Chain{}, &v1alpha1.Tunnel{}, &corev1.Secret{}} {
		inf, err := k.cache.GetInformer(ctx, o)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- k.cache.Start(ctx) }()
	if !k.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("watching namespace %q: caches did not sync (check the API server address and the relay's RBAC)", k.o.Namespace)
	}
	k.o.Log.Info("watching the cluster")
	defer func() {
		if r := k.relay.Swap(nil); r != nil {
			r.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err != nil {
				return err
			}
			return nil
		case <-k.changed:
		}
		select { // let a burst settle
		case <-time.After(settle):
		case <-ctx.Done():
			return nil
		}
		if err := k.apply(ctx); err != nil {
			k.o.Log.Warn("cannot apply the cluster's state yet", "err", err)
		}
	}
}

func (k *Relay) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// apply reads the cache and brings the relay up to date.
func (k *Relay) apply(ctx context.Context) error {
	var secret corev1.Secret
	err := k.cache.Get(ctx, types.NamespacedName{Namespace: k.o.Namespace, Name: v1alpha1.RelayObjectName(k.o.Name)}, &secret)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("certificate Secret %s/%s does not exist yet (the operator issues it for RelayNode %q)",
			k.o.Namespace, v1alpha1.RelayObjectName(k.o.Name), k.o.Name)
	}
	if err != nil {
		return err
	}
	set, err := k.manifests(ctx)
	if err != nil {
		return err
	}
	r := k.relay.Load()
	if r == nil {
		return k.start(set, &secret)
	}
	if cert := secret.Data[corev1.TLSCertKey]; !bytes.Equal(cert, k.certPEM) {
		if err := r.Identity().Renew(cert, secret.Data[corev1.TLSPrivateKeyKey]); err != nil {
			k.o.Log.Error("renewed certificate rejected; keeping the current one", "err", err)
		} else {
			k.certPEM = cert
			k.o.Log.Info("certificate renewed")
		}
	}
	return r.Update(set)
}

func (k *Relay) start(set *manifest.Set, secret *corev1.Secret) error {
	id, err := pki.NewIdentity(k.o.Name, secret.Data["ca.crt"], secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("certificate Secret %s: %w", secret.Name, err)
	}
	r, err := relay.New(relay.Config{Name: k.o.Name, Manifests: set, Identity: id, Metrics: k.o.Metrics, Log: k.o.Log,
		MaxFlows: k.o.MaxFlows, MaxFlowsPerTunnel: k.o.MaxFlowsPerTunnel, MaxFlowsPerSource: k.o.MaxFlowsPerSource,
		NoTUNOffload: k.o.NoTUNOffload})
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	k.certPEM = secret.Data[corev1.TLSCertKey]
	k.relay.Store(r)
	return nil
}

// manifests builds the relay's view of its namespace. Peers are dialed at
// the endpoints the operator published in their status (spec.endpoints
// when the RelayNode names them). Objects with problems are left out and
// logged once, not every time anything changes.
func (k *Relay) manifests(ctx context.Context) (*manifest.Set, error) {
	var rl v1alpha1.RelayNodeList
	var cl v1alpha1.ChainList
	var tl v1alpha1.TunnelList
	for _, l := range []client.ObjectList{&rl, &cl, &tl} {
		if err := k.cache.List(ctx, l, client.InNamespace(k.o.Namespace)); err != nil {
			return nil, err
		}
	}
	relays := make([]v1alpha1.RelayNode, len(rl.Items))
	for i, r := range rl.Items {
		relays[i] = *r.DeepCopy()
		if len(r.Status.Endpoints) > 0 {
			relays[i].Spec.Endpoints = slices.Clone(r.Status.Endpoints)
		}
	}
	set, problems := manifest.FromObjects(relays, cl.Items, tl.Items)
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Error()
	}
	if !slices.Equal(msgs, k.problems) {
		k.problems = msgs
		for _, m := range msgs {
			k.o.Log.Warn("left out of this relay's configuration", "problem", m)
		}
	}
	if set.Relay(k.o.Name) == nil {
		return nil, errors.New("RelayNode " + k.o.Name + " is not in namespace " + k.o.Namespace + " (or has a problem: " + strings.Join(msgs, "; ") + ")")
	}
	return set, nil
}
