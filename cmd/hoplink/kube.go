package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/relay/kube"
)

// kubeFlags say how to reach the API server and which namespace to use.
type kubeFlags struct {
	kubeconfig string
	namespace  string
}

func (k *kubeFlags) register(f *pflag.FlagSet) {
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig `FILE` (default: $KUBECONFIG, ~/.kube/config, or the pod's service account)")
	f.StringVarP(&k.namespace, "namespace", "n", "", "the `NAMESPACE` (default: $POD_NAMESPACE, else default)")
}

func (k *kubeFlags) config() (*rest.Config, error) {
	if k.kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	}
	return ctrl.GetConfig()
}

func (k *kubeFlags) ns(fallback string) string {
	if k.namespace != "" {
		return k.namespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return fallback
}

// useSlog sends controller-runtime's and client-go's logs through slog.
func useSlog(log *slog.Logger) {
	l := logr.FromSlogHandler(log.Handler())
	ctrl.SetLogger(l)
	klog.SetLogger(l)
}

func runKubeRelay(log *slog.Logger, kf *kubeFlags, name, metricsAddr string, profiling bool, drain time.Duration, o kube.Options) error {
	if name == "" {
		return fmt.Errorf("--name: required: the RelayNode this process runs")
	}
	useSlog(log)
	cfg, err := kf.config()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	reg, m := newRegistry()
	o.Config, o.Namespace, o.Name, o.Metrics, o.Log = cfg, kf.ns("default"), name, m, log
	k, err := kube.New(o)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-sigs:
			log.Info("shutting down")
			cancel()
		case <-ctx.Done():
		}
	}()
	srv, err := serveMetrics(metricsAddr, reg, k.Ready, profiling, log)
	if err != nil {
		return err
	}
	if srv != nil {
		defer srv.Close()
	}
	err = k.Run(ctx)
	dctx, dcancel := drainContext(sigs, drain, log)
	k.Shutdown(dctx)
	dcancel()
	log.Info("shut down")
	return err
}

func newOperatorCmd(lf *logFlags) *cobra.Command {
	var (
		kf                     kubeFlags
		o                      controllers.Options
		caSecret               string
		metricsAddr, probeAddr string
		renewBefore            time.Duration
		relayResources         string
		webhookPort            int
		webhookService         string
		webhookConfig          string
		webhookClientCA        string
		webhookClientNames     []string
		mcsGateway, mcsPorts   string
		mcsCoreDNS             string
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Reconcile RelayNodes, Chains and Tunnels into relay DaemonSets, certificates and Services",
		Example: `  # outside a pod, against the current kubeconfig context
  hoplink operator --relay-image hoplink:v0.9.0 --webhook-port 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger()
			if err != nil {
				return err
			}
			useSlog(log)
			if o.RelayResources, err = parseResources(relayResources); err != nil {
				return err
			}
			if o.PrivilegedRelays != controllers.PrivilegedNamespaceLabel && o.PrivilegedRelays != controllers.PrivilegedAny {
				return fmt.Errorf("--privileged-relays %q: want %s (namespaces labelled %s=true) or %s",
					o.PrivilegedRelays, controllers.PrivilegedNamespaceLabel, controllers.LabelPrivilegedRelays, controllers.PrivilegedAny)
			}
			if o.NodeEgress != controllers.PrivilegedNamespaceLabel && o.NodeEgress != controllers.PrivilegedAny {
				return fmt.Errorf("--node-egress %q: want %s (namespaces labelled %s=true) or %s",
					o.NodeEgress, controllers.PrivilegedNamespaceLabel, v1alpha1.LabelEgressHost, controllers.PrivilegedAny)
			}
			if len(o.WatchNamespaces) > 0 && o.PrivilegedRelays == controllers.PrivilegedNamespaceLabel {
				return fmt.Errorf("--watch-namespaces with --privileged-relays=%s: reading namespaces' labels is a cluster-wide permission a namespace-scoped operator does not have; "+
					"the namespaces you watch are the opt-in: use --privileged-relays=%s", controllers.PrivilegedNamespaceLabel, controllers.PrivilegedAny)
			}
			if len(o.WatchNamespaces) > 0 && webhookPort != 0 {
				return fmt.Errorf("--watch-namespaces with the sidecar webhook: its configuration is cluster-wide; use --webhook-port=0 in a namespace-scoped install")
			}
			if len(webhookClientNames) > 0 && webhookClientCA == "" {
				return fmt.Errorf("--webhook-client-names without --webhook-client-ca: the names are checked in certificates that CA signed")
			}
			if err := parseMultiCluster(&o.MultiCluster, mcsGateway, mcsPorts, mcsCoreDNS); err != nil {
				return err
			}
			cfg, err := kf.config()
			if err != nil {
				return fmt.Errorf("kubernetes config: %w", err)
			}
			ns := kf.ns("hoplink-system")
			o.CASecret = types.NamespacedName{Namespace: ns, Name: "hoplink-ca"}
			o.CreateCA = caSecret == ""
			if caSecret != "" {
				o.CASecret.Name = caSecret
			}
			o.MetricsAddr, o.ProbeAddr, o.PprofAddr, o.RenewBefore = offAsZero(metricsAddr), offAsZero(probeAddr), offAsZero(o.PprofAddr), renewBefore
			o.LeaderElectionNamespace = ns
			o.Log = log
			o.Version = version
			if webhookPort != 0 {
				o.Webhook = controllers.WebhookOptions{Port: webhookPort, Config: webhookConfig,
					Secret:   types.NamespacedName{Namespace: ns, Name: webhookService + "-cert"},
					Hosts:    []string{webhookService + "." + ns + ".svc", webhookService + "." + ns, webhookService},
					ClientCA: webhookClientCA, ClientNames: webhookClientNames}
			}
			ctx := ctrl.SetupSignalHandler()
			if o.Image == "" {
				if o.Image, err = ownImage(ctx, cfg); err != nil {
					return fmt.Errorf("--relay-image: required outside a pod (the image relay pods run: this binary's): %w", err)
				}
			}
			mgr, err := controllers.NewManager(ctx, cfg, o)
			if err != nil {
				return err
			}
			log.Info("operator starting", "namespace", ns, "ca", o.CASecret.String(), "relayImage", o.Image)
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	kf.register(f)
	f.StringVar(&o.Image, "relay-image", os.Getenv("HOPLINK_RELAY_IMAGE"), "`IMAGE` of relay pods (default $HOPLINK_RELAY_IMAGE, else the operator pod's own image)")
	f.StringVar(&caSecret, "ca-secret", "", "`NAME` of the Secret in --namespace holding the relay CA (tls.crt, tls.key); default: hoplink-ca, created if missing")
	f.StringVar(&metricsAddr, "metrics-addr", ":8080", "serve the operator's /metrics at `ADDR` ("+notServedHelp+")")
	f.StringVar(&probeAddr, "health-probe-addr", ":8081", "serve /healthz and /readyz at `ADDR` ("+notServedHelp+")")
	f.StringVar(&o.PprofAddr, "pprof-addr", "", "serve /debug/pprof at `ADDR` ("+notServedHelp+")")
	// The names controller-runtime's scaffolding gives these, which the
	// operator took before its flags matched the relays'.
	deprecatedAlias(f, "metrics-bind-address", "metrics-addr")
	deprecatedAlias(f, "health-probe-bind-address", "health-probe-addr")
	deprecatedAlias(f, "pprof-bind-address", "pprof-addr")
	f.BoolVar(&o.LeaderElection, "leader-elect", false, "elect a leader, so that replicas can stand by")
	f.Float32Var(&o.QPS, "kube-api-qps", controllers.DefaultQPS, "most requests a second to the API server per resource type (twice as many in a burst)")
	f.StringVar(&relayResources, "relay-resources", "", "requests and limits of relay containers whose RelayNode sets none, as `JSON`: "+`{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"memory":"256Mi"}}`)
	f.StringVar(&o.NodeEgress, "node-egress", controllers.PrivilegedNamespaceLabel, "`WHERE` host-network relays may reach their node for a Tunnel (loopback, link-local and metadata addresses, the node's addresses, TUN routes over its routes): "+
		controllers.PrivilegedNamespaceLabel+" (namespaces labelled "+v1alpha1.LabelEgressHost+"=true; none in a namespace-scoped install) or "+controllers.PrivilegedAny)
	f.IntVar(&webhookPort, "webhook-port", 9443, "serve the sidecar injection webhook on this `PORT` (0: no webhook)")
	f.StringVar(&webhookService, "webhook-service", "hoplink-webhook", "`NAME` of the Service in --namespace in front of the webhook: its serving certificate names it (and is kept in the Secret NAME-cert)")
	f.StringVar(&webhookConfig, "webhook-config", "hoplink-sidecar-injector", "`NAME` of the MutatingWebhookConfiguration whose caBundle the operator keeps current (empty: none)")
	f.StringVar(&webhookClientCA, "webhook-client-ca", "", "take webhook callers only with a client certificate signed by a CA of this PEM `FILE`, as the API server presents when its admission configuration gives it one (empty: any caller)")
	f.StringSliceVar(&webhookClientNames, "webhook-client-names", nil, "with --webhook-client-ca, the `NAMES` (common name or DNS name) a caller's certificate must carry one of (empty: any the CA signed)")
	f.StringSliceVar(&o.WatchNamespaces, "watch-namespaces", nil, "serve only these `NAMESPACES` (and --namespace): a namespace-scoped install with Roles, not ClusterRoles (default every namespace)")
	f.StringSliceVar(&o.AllowedRelayImages, "allowed-relay-images", nil, "`PREFIXES` of images a RelayNode's spec.image may name besides the operator's relay image (default none)")
	f.StringVar(&o.PrivilegedRelays, "privileged-relays", controllers.PrivilegedNamespaceLabel, "`WHERE` RelayNodes may run relays on the host network or with TUN devices: "+
		controllers.PrivilegedNamespaceLabel+" (namespaces labelled "+controllers.LabelPrivilegedRelays+"=true) or "+controllers.PrivilegedAny)
	f.DurationVar(&renewBefore, "renew-before", 0, "renew relay certificates this long before expiry (default: a third of their validity)")
	f.StringVar(&mcsGateway, "mcs-gateway", "", "turn on the Multi-Cluster Services API: `NAMESPACE/NAME` of the RelayNode where this cluster's calls to imported services enter the relays, and other clusters' leave them (empty: off)")
	f.StringVar(&o.MultiCluster.ClusterID, "cluster-id", "", "this cluster's `ID` in its clusterset, a DNS label (the About API's ClusterProperty cluster.clusterset.k8s.io wins where it exists)")
	f.StringVar(&o.MultiCluster.ClusterSet, "clusterset", "", "the clusterset's `NAME` (the ClusterProperty clusterset.k8s.io wins where it exists)")
	f.StringVar(&o.MultiCluster.Mode, "mcs-route-mode", "sum", "`MODE` the Chains to other clusters route in: sum or pipe")
	f.StringVar(&mcsCoreDNS, "mcs-coredns", "", "keep the clusterset.local zone in the Corefile of CoreDNS's ConfigMap and Deployment `NAMESPACE/NAME` (kubeadm's: kube-system/coredns; empty: leave CoreDNS alone)")
	f.StringVar(&mcsPorts, "mcs-ports", fmt.Sprintf("%d-%d", controllers.DefaultImportPortFirst, controllers.DefaultImportPortLast), "listen ports `FIRST-LAST` the gateway gives imported services' Tunnels")
	return cmd
}

// parseMultiCluster reads the multicluster flags into o.
func parseMultiCluster(o *controllers.MultiClusterOptions, gateway, ports, coreDNS string) error {
	if gateway == "" {
		if coreDNS != "" {
			return fmt.Errorf("--mcs-coredns needs multicluster mode: set --mcs-gateway too")
		}
		return nil
	}
	if coreDNS != "" {
		ns, name, ok := strings.Cut(coreDNS, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--mcs-coredns %q: want NAMESPACE/NAME of CoreDNS's ConfigMap and Deployment, such as kube-system/coredns", coreDNS)
		}
		o.CoreDNS = types.NamespacedName{Namespace: ns, Name: name}
	}
	ns, name, ok := strings.Cut(gateway, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--mcs-gateway %q: want NAMESPACE/NAME of the gateway RelayNode", gateway)
	}
	o.Gateway = types.NamespacedName{Namespace: ns, Name: name}
	first, last, ok := strings.Cut(ports, "-")
	a, err1 := strconv.Atoi(first)
	b, err2 := strconv.Atoi(last)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("--mcs-ports %q: want FIRST-LAST, such as 40000-44999", ports)
	}
	o.Ports = [2]int32{int32(a), int32(b)}
	return nil // checked once the cluster's ID is known (NewManager)
}

// ownImage is the image of the operator's own pod (POD_NAME and
// POD_NAMESPACE come from the downward API): relays run the same binary.
func ownImage(ctx context.Context, cfg *rest.Config) (string, error) {
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || ns == "" {
		return "", fmt.Errorf("POD_NAME and POD_NAMESPACE are not set")
	}
	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return "", err
	}
	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		return "", err
	}
	return pod.Spec.Containers[0].Image, nil
}

// parseResources reads --relay-resources; empty means none.
func parseResources(s string) (*corev1.ResourceRequirements, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var r corev1.ResourceRequirements
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf(`--relay-resources: %w; want JSON such as {"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"memory":"256Mi"}}`, err)
	}
	return &r, nil
}
