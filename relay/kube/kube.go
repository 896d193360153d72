// Package kube runs a relay inside Kubernetes: it watches the relay's
// RelayNode, the Chains it is a member of with their Tunnels, its peers'
// RelayNodes and published endpoints, and its own certificate Secret
// (View), and applies every change to the running relay (Relay). New
// Tunnels open, deleted ones close, a route change applies to new flows,
// and a renewed certificate to new handshakes.
package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/egress"
)

// Options say which relay to run and against which API server.
type Options struct {
	Config    *rest.Config
	Namespace string
	Name      string // the RelayNode
	Version   string // reported in the relay's status
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	MaxFlows  int
	// MaxFlowsPerTunnel and MaxFlowsPerSource are relay.Config's.
	MaxFlowsPerTunnel, MaxFlowsPerSource int
	// NoTUNOffload opens tun Tunnels' devices without offload.
	NoTUNOffload bool
	// CertsDir, when set, holds the certificate as a mounted Secret does
	// (ca.crt, tls.crt, tls.key), read instead of the Secret through the
	// API and re-read as the kubelet updates it: a sidecar relay's pod has
	// the Secret as a volume, and its service account may not read it.
	CertsDir string
	// Egress is relay.Config's: the node's addresses refused to exits
	// (nil: none).
	Egress *egress.Policy
}

// Relay is a relay driven by the Kubernetes API.
type Relay struct {
	o     Options
	view  *View
	relay atomic.Pointer[relay.Relay] // nil until the certificate and RelayNode exist
	board *adminapi.Board             // the clusterset report it serves

	certPEM []byte // the certificate the relay presents
	caPEM   []byte // the CAs it trusts
}

// settle batches a burst of watch events (an apply of many objects) into one
// update of the relay.
const settle = 100 * time.Millisecond

// New prepares the watches; Run starts them.
func New(o Options) (*Relay, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	o.Log = o.Log.With("relay", o.Name, "namespace", o.Namespace)
	v, err := NewView(o)
	if err != nil {
		return nil, err
	}
	return &Relay{o: o, view: v, board: adminapi.NewBoard()}, nil
}

// View is what a relay reads of the API: the objects that carry its member
// label (v1alpha1.MemberLabel), which the operator writes on its RelayNode,
// the Chains it is a member of, their Tunnels, their relays' RelayNodes and
// the EndpointSlices of the sidecar relays among them; and its own
// certificate Secret. What it caches, and what the API server sends it,
// grows with its chains, not with its namespace. Relay applies a View to a
// running relay; hack/bench/operator-scale runs Views alone, as relays
// that watch and relay nothing.
type View struct {
	o       Options
	cache   cache.Cache
	api     client.Reader // uncached, to say why the relay's own RelayNode is not in the cache
	changed chan struct{}
	reports chan struct{} // the clusterset report changed
	events  atomic.Int64  // watch events received, for the scale benchmark

	mu       sync.Mutex
	last     map[string]*v1alpha1.Chain // the Chains the last manifests were built from
	problems []string                   // the last manifest problems logged
	waiting  []string                   // the last Chains logged as waiting for their labels
}

// NewView prepares the watches of o's relay; Start starts them.
func NewView(o Options) (*View, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mine, err := labels.NewRequirement(v1alpha1.MemberLabel(o.Name), selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("RelayNode %q: %w", o.Name, err)
	}
	member := cache.ByObject{Label: labels.NewSelector().Add(*mine)}
	byObject := map[client.Object]cache.ByObject{
		&v1alpha1.RelayNode{}: member,
		&v1alpha1.Chain{}:     member,
		&v1alpha1.Tunnel{}:    member,
		// The slices of its peers' sidecar Services, which copy the
		// Services' labels.
		&discoveryv1.EndpointSlice{}: member,
	}
	if o.CertsDir == "" {
		// Its own certificate, and no other Secret: that is all its RBAC allows.
		byObject[&corev1.Secret{}] = cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", v1alpha1.RelayObjectName(o.Name))}
	}
	// Its cluster's clusterset report, the one ConfigMap it may read, which
	// it serves to other clusters' operators.
	byObject[&corev1.ConfigMap{}] = cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", v1alpha1.ClusterSetReportName)}
	c, err := cache.New(o.Config, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		ByObject:          byObject,
		// Who wrote which field is of no use to a relay, and is a large
		// part of each object.
		DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, err
	}
	api, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &View{o: o, cache: c, api: api, changed: make(chan struct{}, 1), reports: make(chan struct{}, 1)}, nil
}

// watchedKinds are the kinds a View watches.
func (v *View) watchedKinds() []client.Object {
	kinds := []client.Object{&v1alpha1.RelayNode{}, &v1alpha1.Chain{}, &v1alpha1.Tunnel{}, &discoveryv1.EndpointSlice{}}
	if v.o.CertsDir == "" {
		kinds = append(kinds, &corev1.Secret{})
	}
	return kinds
}

// Start starts the watches and returns once the caches hold what the API
// server had, or with why not; they stop when ctx ends, and errc then
// receives what stopped them.
func (v *View) Start(ctx context.Context) (errc <-chan error, err error) {
	poke := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { v.poke() },
		UpdateFunc: func(any, any) { v.poke() },
		DeleteFunc: func(any) { v.poke() },
	}
	for _, o := range v.watchedKinds() {
		inf, err := v.cache.GetInformer(ctx, o)
		if err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(poke); err != nil {
			return nil, err
		}
	}
	// The clusterset report changes nothing the relay runs: it goes to
	// the Board alone, at once, without rebuilding the manifests.
	report := func(any) {
		select {
		case v.reports <- struct{}{}:
		default:
		}
	}
	inf, err := v.cache.GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: report,
		UpdateFunc: func(_, o any) { report(o) }, DeleteFunc: report}); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- v.cache.Start(ctx) }()
	if !v.cache.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("watching namespace %q: caches did not sync (check the API server address and the relay's RBAC)", v.o.Namespace)
	}
	return done, nil
}

// Changed receives after a watched object changed.
func (v *View) Changed() <-chan struct{} { return v.changed }

// Reports receives after the clusterset report changed.
func (v *View) Reports() <-chan struct{} { return v.reports }

func (v *View) poke() {
	v.events.Add(1)
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// Events counts the watch events (adds, updates, deletes) the View has
// received since it started.
func (v *View) Events() int64 { return v.events.Load() }

// Cached counts the objects the View holds, by kind.
func (v *View) Cached(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	for kind, l := range map[string]client.ObjectList{"RelayNode": &v1alpha1.RelayNodeList{}, "Chain": &v1alpha1.ChainList{},
		"Tunnel": &v1alpha1.TunnelList{}, "EndpointSlice": &discoveryv1.EndpointSliceList{}} {
		if err := v.cache.List(ctx, l, client.InNamespace(v.o.Namespace), client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		out[kind] = meta.LenList(l)
	}
	return out, nil
}

// Problems are the objects the last manifests left out, and why.
func (v *View) Problems() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.problems)
}

// Ready reports whether the relay runs with its listeners open.
func (k *Relay) Ready() bool {
	r := k.relay.Load()
	return r != nil && r.Ready()
}

// Run watches and relays until ctx ends; Shutdown then drains and closes
// the relay.
func (k *Relay) Run(ctx context.Context) error {
	// Mounted certificate files change without an event: look every few seconds.
	var recheck <-chan time.Time
	if k.o.CertsDir != "" {
		t := time.NewTicker(certRecheck)
		defer t.Stop()
		recheck = t.C
	}
	errc, err := k.view.Start(ctx)
	if err != nil {
		return err
	}
	k.o.Log.Info("watching the cluster")
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err != nil {
				return err
			}
			return nil
		case <-k.view.Changed():
		case <-k.view.Reports():
			k.board.Set(k.view.report(ctx))
			continue
		case <-recheck:
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

// Shutdown drains the relay until ctx ends (see relay.Relay.Drain), then
// closes it. Run must have returned.
func (k *Relay) Shutdown(ctx context.Context) {
	if r := k.relay.Swap(nil); r != nil {
		r.Drain(ctx)
		r.Close()
	}
}

// certRecheck is how often mounted certificate files are read again.
const certRecheck = 10 * time.Second

// certificate returns the relay's certificate files' contents (ca.crt,
// tls.crt, tls.key): from its Secret through the API, or from CertsDir.
func (k *Relay) certificate(ctx context.Context) (*corev1.Secret, error) {
	var secret corev1.Secret
	if dir := k.o.CertsDir; dir != "" {
		secret.Name, secret.Data = dir, map[string][]byte{}
		for _, f := range []string{"ca.crt", corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return nil, fmt.Errorf("certificate files: %w (the sidecar mounts Secret %s there)", err, v1alpha1.RelayObjectName(k.o.Name))
			}
			secret.Data[f] = b
		}
		return &secret, nil
	}
	err := k.view.cache.Get(ctx, types.NamespacedName{Namespace: k.o.Namespace, Name: v1alpha1.RelayObjectName(k.o.Name)}, &secret)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("certificate Secret %s/%s does not exist yet (the operator issues it for RelayNode %q)",
			k.o.Namespace, v1alpha1.RelayObjectName(k.o.Name), k.o.Name)
	}
	return &secret, err
}

// apply reads the cache and brings the relay up to date.
func (k *Relay) apply(ctx context.Context) error {
	secret, err := k.certificate(ctx)
	if err != nil {
		return err
	}
	set, err := k.view.Manifests(ctx)
	if err != nil {
		return err
	}
	k.board.Set(k.view.report(ctx))
	r := k.relay.Load()
	if r == nil {
		return k.start(set, secret)
	}
	// A renewed certificate, or a CA rotation's bundle: both at once, the
	// certificate checked against the CAs that come with it.
	if cert, ca := secret.Data[corev1.TLSCertKey], secret.Data["ca.crt"]; !bytes.Equal(cert, k.certPEM) || !bytes.Equal(ca, k.caPEM) {
		if err := r.Identity().Update(ca, cert, secret.Data[corev1.TLSPrivateKeyKey]); err != nil {
			if k.o.Metrics != nil {
				k.o.Metrics.ReloadsRejected.WithLabelValues(k.o.Name, "certificates").Inc()
			}
			k.o.Log.Error("new certificate or CA rejected; keeping the current ones", "err", err)
		} else {
			k.certPEM, k.caPEM = cert, ca
			k.o.Log.Info("certificate renewed", "expires", r.Identity().NotAfter().UTC().Format(time.RFC3339))
		}
	}
	return r.Update(set)
}

func (k *Relay) start(set *manifest.Set, secret *corev1.Secret) error {
	id, err := pki.NewIdentity(k.o.Name, secret.Data["ca.crt"], secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("certificate Secret %s: %w", secret.Name, err)
	}
	// Its peers are the RelayNodes of its namespace (the View reads no
	// other), and their certificates must say so.
	id.Namespace = k.o.Namespace
	// A relay in the pod network sits behind its node's SNAT.
	self := set.Relay(k.o.Name).Spec
	podNetwork := self.IsSidecar() || self.HostNetwork != nil && !*self.HostNetwork
	r, err := relay.New(relay.Config{Name: k.o.Name, Manifests: set, Identity: id, Metrics: k.o.Metrics, Log: k.o.Log,
		MaxFlows: k.o.MaxFlows, MaxFlowsPerTunnel: k.o.MaxFlowsPerTunnel, MaxFlowsPerSource: k.o.MaxFlowsPerSource,
		NoTUNOffload: k.o.NoTUNOffload, SeparateDialPort: podNetwork, Version: k.o.Version, Board: k.board, Egress: k.o.Egress})
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	k.certPEM, k.caPEM = secret.Data[corev1.TLSCertKey], secret.Data["ca.crt"]
	k.relay.Store(r)
	return nil
}

// Manifests builds the relay's manifests from the View. Peers are dialed
// at the endpoints the operator published in their status (spec.endpoints
// when the RelayNode names them). Objects with problems are left out and
// logged once, not every time anything changes; so are RelayNodes whose
// name the operator has not confirmed (manifest.HeldNames), this relay's
// own included, and what goes through them. A Chain whose labels say the
// relay should not act on its spec yet runs as it was (labelled).
func (v *View) Manifests(ctx context.Context) (*manifest.Set, error) {
	var rl v1alpha1.RelayNodeList
	var cl v1alpha1.ChainList
	var tl v1alpha1.TunnelList
	for _, l := range []client.ObjectList{&rl, &cl, &tl} {
		if err := v.cache.List(ctx, l, client.InNamespace(v.o.Namespace)); err != nil {
			return nil, err
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	chains, tunnels, waiting := labelled(v.o.Name, cl.Items, tl.Items, v.last)
	if !slices.Equal(waiting, v.waiting) {
		v.waiting = waiting
		if len(waiting) > 0 {
			v.o.Log.Info("Chains whose edit this relay takes after the operator's labels say so; each runs as it was meanwhile, or not yet if new",
				"chains", waiting)
		}
	}
	relays := make([]v1alpha1.RelayNode, len(rl.Items))
	replicas := map[string][]manifest.Replica{}
	for i, r := range rl.Items {
		var eps []discoveryv1.EndpointSlice
		if r.Spec.IsSidecar() {
			var err error
			if eps, err = v.replicaSlices(ctx, &r); err != nil {
				return nil, err
			}
			replicas[r.Name] = manifest.Replicas(eps, r.Spec.RelayPort())
		}
		relays[i] = manifest.Dialed(&r, eps)
	}
	// Only relays whose name the operator confirmed are peers, route
	// members or dial targets: another namespace's relay may hold a
	// certificate for a name that this namespace's RelayNode lost.
	relays, unheld := manifest.HeldNames(relays)
	set, problems := manifest.FromObjects(relays, chains, tunnels)
	set.SetReplicas(replicas)
	v.last = make(map[string]*v1alpha1.Chain, len(chains))
	for i := range chains {
		v.last[manifest.Key(chains[i].Namespace, chains[i].Name)] = &chains[i]
	}
	problems = append(unheld, problems...)
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Error()
	}
	if !slices.Equal(msgs, v.problems) {
		v.problems = msgs
		for _, m := range msgs {
			v.o.Log.Warn("left out of this relay's configuration", "problem", m)
		}
	}
	if set.Relay(v.o.Name) == nil {
		return nil, v.missingSelf(ctx, msgs)
	}
	return set.WithVersions(pending(v.o.Name, cl.Items, waiting, set)), nil
}

// report is the clusterset report its operator stored, and its version
// (the ConfigMap's resource version); none when there is none.
func (v *View) report(ctx context.Context) ([]byte, string) {
	var cm corev1.ConfigMap
	err := v.cache.Get(ctx, types.NamespacedName{Namespace: v.o.Namespace, Name: v1alpha1.ClusterSetReportName}, &cm)
	if err != nil || cm.BinaryData[v1alpha1.ClusterSetReportKey] == nil {
		return nil, ""
	}
	return cm.BinaryData[v1alpha1.ClusterSetReportKey], cm.ResourceVersion
}

// pending are the edits relay self waits to take (labelled), as versions
// it admits hops of meanwhile (manifest.Version): each relay takes an edit
// from its own watch, and a peer that took it first may already send new
// flows along it. Only Chains self runs, and edits that name self.
func pending(self string, chains []v1alpha1.Chain, waiting []string, set *manifest.Set) map[string][]manifest.Version {
	if len(waiting) == 0 {
		return nil
	}
	wait := make(map[string]bool, len(waiting))
	for _, k := range waiting {
		wait[k] = true
	}
	out := map[string][]manifest.Version{}
	for i := range chains {
		key := manifest.Key(chains[i].Namespace, chains[i].Name)
		if !wait[key] || set.Chain(key) == nil || !slices.Contains(manifest.Named(&chains[i]), self) {
			continue
		}
		c := chains[i].DeepCopy()
		c.Default()
		out[key] = []manifest.Version{{Chain: c}}
	}
	return out
}

// missingSelf says why the relay's own RelayNode is not among what it
// watches: it does not exist (with the name of the namespace nearest), or
// it does but the operator has not labelled it for the relay yet, as on a
// relay's first start or with an operator older than member labels. The
// relay then waits, not ready, for the label's watch event.
func (v *View) missingSelf(ctx context.Context, problems []string) error {
	msg := "RelayNode " + v.o.Name + " is not in namespace " + v.o.Namespace + " (or has a problem: " + strings.Join(problems, "; ") + ")"
	var rn metav1.PartialObjectMetadata
	rn.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RelayNode"))
	err := v.api.Get(ctx, types.NamespacedName{Namespace: v.o.Namespace, Name: v.o.Name}, &rn)
	switch {
	case err == nil:
		if _, ok := rn.Labels[v1alpha1.MemberLabel(v.o.Name)]; !ok {
			return fmt.Errorf("RelayNode %s does not carry label %s yet: the operator writes it, and this relay watches only what carries it (is an operator of this version running?)",
				v.o.Name, v1alpha1.MemberLabel(v.o.Name))
		}
	case apierrors.IsNotFound(err):
		var all metav1.PartialObjectMetadataList
		all.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RelayNodeList"))
		if v.api.List(ctx, &all, client.InNamespace(v.o.Namespace)) == nil {
			names := make([]string, len(all.Items))
			for i, r := range all.Items {
				names[i] = r.Name
			}
			return errors.New(msg + manifest.DidYouMean(v.o.Name, names))
		}
	}
	return errors.New(msg)
}

// labelled picks the Chains and Tunnels relay self acts on from what its
// member label selected. A Chain whose labels say self should not act on
// its spec yet (manifest.Current: an edit the operator has not labelled
// for, or labels a new relay of the Chain first, or a relay the edit took
// out) is kept as self last took it (last), or left out while self never
// had it; those are waiting. A Tunnel whose Chain the relay does not take
// is not its own yet (it was moved, or its Chain is waiting), and is left
// out without a problem: the operator's labels follow.
func labelled(self string, chains []v1alpha1.Chain, tunnels []v1alpha1.Tunnel, last map[string]*v1alpha1.Chain) ([]v1alpha1.Chain, []v1alpha1.Tunnel, []string) {
	var outC []v1alpha1.Chain
	var waiting []string
	taken := map[string]bool{}
	for _, c := range chains {
		key := manifest.Key(c.Namespace, c.Name)
		if !manifest.Current(&c, self) {
			waiting = append(waiting, key)
			prev := last[key]
			if prev == nil {
				continue
			}
			c = *prev
		}
		outC = append(outC, c)
		taken[c.Name] = true
	}
	var outT []v1alpha1.Tunnel
	for _, t := range tunnels {
		if taken[t.Spec.Chain] {
			outT = append(outT, t)
		}
	}
	slices.Sort(waiting)
	return outC, outT, waiting
}

// replicaSlices are the EndpointSlices of a sidecar relay's headless
// Service: its ready pods are where peers spread new flows.
func (v *View) replicaSlices(ctx context.Context, rn *v1alpha1.RelayNode) ([]discoveryv1.EndpointSlice, error) {
	var eps discoveryv1.EndpointSliceList
	err := v.cache.List(ctx, &eps, client.InNamespace(rn.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: v1alpha1.RelayObjectName(rn.Name)})
	return eps.Items, err
}
