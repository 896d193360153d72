package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/inject"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/routectl"
)

// Options configure the operator.
type Options struct {
	// Image is the relay image (this binary) for RelayNodes without spec.image.
	Image string
	// AllowedRelayImages are prefixes of other images RelayNodes may name in
	// spec.image; none: the operator's image alone.
	AllowedRelayImages []string
	// PrivilegedRelays says where RelayNodes may run host-network and TUN
	// relays: PrivilegedNamespaceLabel (default) or PrivilegedAny.
	PrivilegedRelays string
	// NodeEgress says where host-network relays may reach their node for a
	// Tunnel (loopback, link-local, the node's addresses and routes):
	// PrivilegedNamespaceLabel (default: namespaces labelled
	// v1alpha1.LabelEgressHost=true) or PrivilegedAny.
	NodeEgress string
	// WatchNamespaces, when set, confines the operator to these namespaces
	// (and its own, for its CA and lease): a namespace-scoped install, with
	// Roles where a cluster-wide one has ClusterRoles. It then signs no pod
	// certificates and reads no namespaces (both cluster-scoped).
	WatchNamespaces []string
	// RelayResources are the requests and limits of relay containers whose
	// RelayNode sets none.
	RelayResources *corev1.ResourceRequirements
	// CASecret holds the relay CA. CreateCA makes one there when it is missing.
	CASecret types.NamespacedName
	CreateCA bool
	// RenewBefore renews relay certificates this long before they expire
	// (default: a third of their validity).
	RenewBefore time.Duration

	// QPS bounds the operator's requests to the API server (default DefaultQPS).
	QPS float32

	// FirstStatusWait is how long a new Chain or Tunnel waiting only for
	// what is coming up goes without a Ready condition (firstStatus);
	// 0: DefaultFirstStatusWait, negative: none.
	FirstStatusWait time.Duration

	MetricsAddr, ProbeAddr  string
	PprofAddr               string // empty: no profiling endpoint
	LeaderElection          bool
	LeaderElectionNamespace string

	// Log receives the route controller's logs (default slog.Default()).
	Log *slog.Logger

	// Webhook serves sidecar injection when its Port is set.
	Webhook WebhookOptions
	// MultiCluster turns on the Multi-Cluster Services API.
	MultiCluster MultiClusterOptions
	// Version of the operator, recorded on the pods it injects.
	Version string
}

// The injection webhook reads the namespace (may it run a TUN sidecar?)
// and keeps its own configuration's caBundle.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;patch,resourceNames=hoplink-sidecar-injector

// WebhookOptions configure the sidecar injection webhook.
type WebhookOptions struct {
	Port int    // 0: no webhook server
	Host string // address to bind (default every address)
	// Secret keeps the serving certificate and its CA.
	Secret types.NamespacedName
	// Hosts the serving certificate names (the webhook Service's DNS names).
	Hosts []string
	// Config is the MutatingWebhookConfiguration whose caBundle the
	// operator keeps current; empty: none.
	Config string
	// ClientCA, when set, is a PEM file of the CAs that sign the API
	// server's client certificate for webhooks: callers without such a
	// certificate are refused at the handshake (inject.ClientAuth). With
	// ClientNames, the certificate must name one of them.
	ClientCA    string
	ClientNames []string
}

// DefaultQPS is the operator's API request rate unless told otherwise,
// per resource type (controller-runtime keeps a REST client, and so a
// rate limiter, per kind). At 50 a second the Chains' writes alone (their
// member labels in two steps and a status, three per Chain) took ten
// minutes for 10,000 Chains while the API server used half a core
// (docs/benchmarks.md, operator-scale); the API server's own priority and
// fairness, not this, protects it from a burst.
const DefaultQPS = 150

func logOr(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// watched is the cache's namespaces: every one (nil) unless the operator is
// confined to some, then those and its own.
func watched(o Options) map[string]cache.Config {
	if len(o.WatchNamespaces) == 0 {
		return nil
	}
	m := map[string]cache.Config{o.CASecret.Namespace: {}}
	for _, ns := range o.WatchNamespaces {
		m[ns] = cache.Config{}
	}
	return m
}

// cacheOptions keeps the operator's cache to hoplink's own objects. Its
// ClusterRole must still list and watch these kinds in every namespace
// (RBAC selects no labels, and relays may run in any namespace), but what
// it holds in memory, and what a reconciler can read from it by mistake,
// is only what it made: relay pods and the relays' DaemonSets,
// ServiceAccounts, Roles, RoleBindings (all labelled with their
// RelayNode), the Secrets and Services it wrote. In multicluster mode
// Services and EndpointSlices are everyone's: exports name any Service.
func cacheOptions(o Options) cache.Options {
	hasRelay, _ := labels.NewRequirement(LabelRelayNode, selection.Exists, nil)
	relays := cache.ByObject{Label: labels.NewSelector().Add(*hasRelay)}
	mine := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{labelManagedBy: managerName})}
	// Sidecar relays' replicas: the slices of their Services, which carry
	// the label.
	slices, services := relays, mine
	if o.MultiCluster.On() {
		slices, services = cache.ByObject{}, cache.ByObject{}
	}
	return cache.Options{DefaultNamespaces: watched(o), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:            relays,
		&appsv1.DaemonSet{}:      relays,
		&corev1.ServiceAccount{}: relays,
		&rbacv1.Role{}:           relays,
		&rbacv1.RoleBinding{}:    relays,
		&corev1.Secret{}:         mine,
		&corev1.Service{}:        services,
		// Only the requests addressed to this operator's signer.
		&certificatesv1.PodCertificateRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", inject.SignerName)},
		&discoveryv1.EndpointSlice{}:            slices,
	}}
}

// Scheme knows the Kubernetes kinds the operator touches and hoplink's own.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := mcsv1beta1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// NewManager builds the operator: the CA, a manager whose cache holds only the
// Pods and Secrets that are hoplink's, and the three reconcilers.
func NewManager(ctx context.Context, cfg *rest.Config, o Options) (ctrl.Manager, error) {
	scheme := Scheme()
	// client-go's default (5 requests a second) makes a large apply take
	// many minutes; writes stay bounded by what actually changes.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.QPS, 2*int(o.QPS)
	if o.QPS <= 0 {
		cfg.QPS, cfg.Burst = DefaultQPS, 2*DefaultQPS
	}
	cfg.Wrap(countWrites)
	// How long requests waited for the rate limit above: whether it, or
	// the API server, bounds a large apply (docs/benchmarks.md).
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRateLimiterLatency)
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	ca, err := LoadOrCreateCA(ctx, direct, o.CASecret, o.CreateCA)
	if err != nil {
		return nil, err
	}
	if o.MultiCluster.On() {
		if len(o.WatchNamespaces) > 0 {
			return nil, fmt.Errorf("multicluster mode (--mcs-gateway) needs a cluster-wide operator: ServiceExports and imports live in every namespace; drop --watch-namespaces")
		}
		if o.MultiCluster, err = clusterIdentity(ctx, direct, o.MultiCluster, logOr(o.Log)); err != nil {
			return nil, err
		}
		if err := o.MultiCluster.Check(); err != nil {
			return nil, err
		}
	}
	var serving *inject.ServingCert
	var hooks webhook.Server
	if o.Webhook.Port != 0 {
		serving = &inject.ServingCert{Client: direct, Secret: o.Webhook.Secret, Hosts: o.Webhook.Hosts,
			WebhookConfig: o.Webhook.Config, Log: o.Log}
		// The first certificate before serving; a missing configuration
		// is reported and retried, not fatal.
		if err := serving.Ensure(ctx); err != nil && !serving.Loaded() {
			return nil, fmt.Errorf("webhook serving certificate: %w", err)
		} else if err != nil {
			logOr(o.Log).Warn("webhook", "err", err)
		}
		var auth *inject.ClientAuth
		if o.Webhook.ClientCA != "" {
			if auth, err = inject.NewClientAuth(o.Webhook.ClientCA, o.Webhook.ClientNames); err != nil {
				return nil, err
			}
		}
		hooks = webhook.NewServer(webhook.Options{Port: o.Webhook.Port, Host: o.Webhook.Host,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) {
				c.GetCertificate = serving.GetCertificate
				if auth != nil {
					auth.Apply(c)
				}
			}}})
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:           hooks,
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        "operator.hoplink.dev",
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		Cache:                   cacheOptions(o),
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	policy := RelayPolicy{Image: o.Image, AllowedImages: o.AllowedRelayImages, Privileged: o.PrivilegedRelays,
		NodeEgress: o.NodeEgress, NamespaceLabels: len(o.WatchNamespaces) == 0}
	if policy.Privileged == "" {
		policy.Privileged = PrivilegedNamespaceLabel
	}
	// Per-pod certificates where the cluster serves PodCertificateRequests
	// (GA in Kubernetes 1.37); the RelayNode's Secret elsewhere.
	_, err = mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: certificatesv1.GroupName, Kind: "PodCertificateRequest"}, "v1")
	podCerts := err == nil && len(o.WatchNamespaces) == 0
	if podCerts {
		// A client of its own, with its own rate limit and connections:
		// what floods the rest of the operator (or the webhook) leaves the
		// signer its requests, and the other way round.
		own, err := signerClient(cfg, scheme, mgr.GetRESTMapper())
		if err != nil {
			return nil, err
		}
		if err := (&PodCertificateSigner{Client: own, Reader: own, CA: ca, Policy: &policy}).SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("pod certificate signer: %w", err)
		}
	}
	if serving != nil {
		if err := mgr.Add(serving); err != nil {
			return nil, err
		}
		// Through the manager: asking it for its webhook server is what
		// adds the server to what it starts (on every replica).
		// It reads the cache alone: a review, which anyone who reaches the
		// port may send, costs no request to the API server. Its informers
		// start with the manager, not at the first review.
		for _, o := range []client.Object{&v1alpha1.RelayNode{}, &corev1.Namespace{}} {
			if _, err := mgr.GetCache().GetInformer(ctx, o); err != nil {
				return nil, fmt.Errorf("webhook's %T informer: %w", o, err)
			}
		}
		cached := mgr.GetClient()
		// Each caller address has an allowance of reviews (inject.SourceLimit):
		// the API server's is its own, whoever else posts.
		mgr.GetWebhookServer().Register(inject.Path, inject.NewSourceLimit(&webhook.Admission{Handler: &inject.Webhook{Reader: cached, Settle: 2 * time.Second,
			NameHolder: func(ctx context.Context, rn *v1alpha1.RelayNode) (string, error) {
				return relayNameHolder(ctx, cached, rn)
			},
			Policy: func(ctx context.Context, rn *v1alpha1.RelayNode) (string, string, error) {
				return policy.Refusal(ctx, cached, rn)
			},
			Config: inject.Config{Image: o.Image, Version: o.Version, Resources: o.RelayResources, PodCertificates: podCerts}}}))
	}
	admin := newRelayAdmin(mgr.GetClient(), ca)
	// What only relays see go wrong, asked of them on the leader.
	reports := newRelayReports(mgr.GetClient(), admin, mgr.GetEventRecorder("hoplink-relay-reports"))
	if err := mgr.Add(reports); err != nil {
		return nil, err
	}
	rn := &RelayNodeReconciler{Client: mgr.GetClient(), Scheme: scheme, CA: ca, Image: o.Image, RenewBefore: o.RenewBefore, PodCertificates: podCerts, Namespaces: o.WatchNamespaces, Resources: o.RelayResources, Version: o.Version,
		Policy: policy, Reader: mgr.GetAPIReader(), Reports: reports, Recorder: mgr.GetEventRecorder("hoplink-relaynode-controller"),
		BufferSysctls: bufferSysctls(cfg, logOr(o.Log))}
	if err := rn.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("RelayNode controller: %w", err)
	}
	o.Log = logOr(o.Log)
	// The route controller: rounds of every routed Chain, measured through
	// the relays' admin API. Reconcilers run on the leader alone, and so
	// do the rounds they start.
	writer := &routeWriter{client: mgr.GetClient(), api: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder("hoplink-route-controller"),
		log: o.Log, written: map[string]time.Time{}, failing: map[string]bool{}}
	routes := routectl.New(routectl.Options{
		Measurer: admin,
		Decide:   writer.decided,
		Metrics:  metrics.NewRoute(ctrlmetrics.Registry),
		Log:      o.Log.With("controller", "route"),
	})
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		routes.Close()
		return nil
	})); err != nil {
		return nil, err
	}
	firstWait := o.FirstStatusWait
	if firstWait == 0 {
		firstWait = DefaultFirstStatusWait
	}
	if err := (&ChainReconciler{Client: mgr.GetClient(), Routes: routes, writer: writer, first: firstStatus{wait: firstWait}}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("Chain controller: %w", err)
	}
	if err := (&TunnelReconciler{Client: mgr.GetClient(), Scheme: scheme, Reports: reports, first: firstStatus{wait: firstWait}}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("Tunnel controller: %w", err)
	}
	if o.MultiCluster.On() {
		if err := setupMultiCluster(mgr, o.MultiCluster, admin, o.Log); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// signerUserAgent names the pod certificate signer's requests.
const signerUserAgent = "hoplink-operator/pod-certificate-signer"

// signerClient is the PodCertificateSigner's: uncached (a request is
// decided on what is stored now), with a rate limiter and HTTP
// connections of its own.
func signerClient(cfg *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper) (client.Client, error) {
	c := rest.CopyConfig(cfg)
	c.UserAgent = signerUserAgent
	c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, err
	}
	return client.New(c, client.Options{Scheme: scheme, Mapper: mapper, HTTPClient: hc})
}

// bufferSysctls asks the API server's version whether relay pods may raise
// their TCP buffers (BufferSysctlsAllowed); it says so in the log either way.
func bufferSysctls(cfg *rest.Config, log *slog.Logger) bool {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		log.Warn("relay pods keep the node's TCP buffer limits: no discovery client", "err", err)
		return false
	}
	v, err := dc.ServerVersion()
	if err != nil {
		log.Warn("relay pods keep the node's TCP buffer limits: the API server's version is unknown", "err", err)
		return false
	}
	ok := BufferSysctlsAllowed(v)
	log.Info("TCP buffer limits of relay pods in the pod network", "server", v.GitVersion, "raised", ok,
		"sysctls", "net.ipv4.tcp_rmem, net.ipv4.tcp_wmem up to 16 MiB (kubelets accept them from 1.32; API server 1.35 or later)")
	return ok
}
