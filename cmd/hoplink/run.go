package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/kube"
	"github.com/hoplink/hoplink/relay/local"
	"github.com/hoplink/hoplink/relay/metricsrv"
)

func newRegistry() (*prometheus.Registry, *metrics.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, metrics.New(reg)
}

func loadManifests(paths []string, log *slog.Logger) (*manifest.Set, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("-f: name at least one manifest file or directory")
	}
	set, err := manifest.Load(paths...)
	if err != nil {
		return nil, err
	}
	for _, s := range set.Skipped {
		log.Debug("skipped object of another API group", "object", s)
	}
	for _, f := range set.ClusterOnly() {
		log.Info("fields that only the operator acts on (running relay pods) are left alone here", "fields", f)
	}
	return set, nil
}

// catchExit takes SIGINT and SIGTERM on the channel it returns, from now
// on: what the process made (local mode's directory) is removed by its
// defers only if no signal ends it first. A write to stdout or stderr
// without a reader fails instead of killing the process by SIGPIPE, for
// the same reason: with 'make demo | tee', Ctrl-C ends tee too, and the
// next log line would.
func catchExit() (chan os.Signal, func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	signal.Ignore(syscall.SIGPIPE)
	return sigs, func() { signal.Stop(sigs) }
}

// serveUntilSignal runs until SIGINT or SIGTERM on sigs, or until gone
// closes (the log's reader went away); then drain (when not nil) takes the
// process out of service for up to grace or until a second signal, and
// stop ends the rest. The admin server answers until the end, so /readyz
// says not ready while the process drains.
func serveUntilSignal(sigs <-chan os.Signal, gone <-chan struct{}, log *slog.Logger, metricsAddr string, profiling bool, reg *prometheus.Registry, ready func() bool,
	drain func(context.Context) int, grace time.Duration, stop func() error) error {
	srv, err := serveMetrics(metricsAddr, reg, ready, profiling, log)
	if err != nil {
		stop()
		return err
	}
	select {
	case <-sigs:
	case <-gone:
	}
	return shutDown(sigs, log, drain, grace, func() {
		if srv != nil {
			srv.Close()
		}
	}, stop, closeTimeout)
}

// serveMetrics serves --metrics-addr, or nothing (a nil server) when it
// says not served.
func serveMetrics(addr string, reg *prometheus.Registry, ready func() bool, profiling bool, log *slog.Logger) (*metricsrv.Server, error) {
	if !served(addr) {
		return nil, nil
	}
	srv, err := metricsrv.Serve(addr, reg, ready, profiling, log)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return srv, nil
}

// closeTimeout bounds the close that follows a drain. On a host busy
// enough, closing every connection of a few dozen relays (local mode) took
// minutes, while the relays still open redialed the ones closed.
const closeTimeout = 10 * time.Second

// shutDown drains (when drain is not nil) for up to grace or until another
// signal, then stops. A stop that has not returned within limit, or by
// another signal, is left to the process's exit, which ends every socket.
func shutDown(sigs <-chan os.Signal, log *slog.Logger, drain func(context.Context) int, grace time.Duration,
	unserve func(), stop func() error, limit time.Duration) error {
	log.Info("shutting down")
	if drain != nil {
		ctx, cancel := drainContext(sigs, grace, log)
		drain(ctx)
		cancel()
	}
	unserve()
	done := make(chan error, 1)
	go func() { done <- stop() }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-sigs:
		log.Warn("another signal: exiting while the relays still close")
	case <-t.C:
		log.Warn("the relays still close: exiting", "after", limit)
	}
	return nil
}

// drainContext ends after grace, or at once on another signal on sigs.
func drainContext(sigs <-chan os.Signal, grace time.Duration, log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	go func() {
		select {
		case <-sigs:
			log.Info("second signal: closing open flows now")
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// drainFlag registers --drain-timeout.
func drainFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "drain-timeout", relay.DefaultDrainTimeout, "on SIGTERM, how long open flows may go on while the relay takes no new ones (a second signal ends them at once; 0 ends them at once)")
}

// localRun is how local mode runs a manifest set: the flags of 'local'
// that 'forward' shares.
type localRun struct {
	metricsAddr, observerCerts string
	profiling, tunOffload      bool
	drainTimeout               time.Duration
}

func (o *localRun) flags(f *pflag.FlagSet) {
	metricsFlag(f, &o.metricsAddr)
	f.BoolVar(&o.profiling, "pprof", false, "also serve /debug/pprof on --metrics-addr")
	f.StringVar(&o.observerCerts, "observer-certs", "", "write the in-memory CA's certificate and an observer certificate into `DIR` (ca.crt, observer.crt, observer.key), for 'hoplink status --certs DIR' (default: a new temporary directory, removed at exit)")
	drainFlag(f, &o.drainTimeout)
}

// run starts every relay of set in this process and serves until a signal.
// files are the manifests as the user named them; without any (forward),
// doc is written beside the observer's files for 'status -f'.
func (o *localRun) run(log *slog.Logger, gone <-chan struct{}, set *manifest.Set, files []string, doc string) error {
	sigs, release := catchExit()
	defer release()
	reg, m := newRegistry()
	n, err := local.Start(set, relay.Config{Metrics: m, Log: log, NoTUNOffload: !o.tunOffload, Version: version})
	if err != nil {
		return portHint(err)
	}
	// What 'hoplink status' needs is written whether or not it was asked
	// for, so that a running network can always be looked at: the CA is in
	// memory and dies with the process, so a directory of our own is
	// removed at exit.
	dir := o.observerCerts
	if dir == "" {
		if dir, err = os.MkdirTemp("", "hoplink-local-"); err != nil {
			n.Close()
			return fmt.Errorf("a directory for the observer's certificate: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	err = writeObserverFiles(n.CA, dir)
	if err == nil && len(files) == 0 {
		files = []string{filepath.Join(dir, "manifests.yaml")}
		err = os.WriteFile(files[0], []byte(doc), 0o644)
	}
	if err != nil {
		n.Close()
		return fmt.Errorf("--observer-certs: %w", err)
	}
	var notOpen []string
	for _, r := range n.Relays {
		for tunnel, err := range r.TunnelErrors() {
			notOpen = append(notOpen, tunnel+": "+err)
		}
	}
	if len(notOpen) > 0 {
		// Each relay logged why and retries; the network is up, not ready.
		slices.Sort(notOpen)
		log.Warn("local network up, but Tunnels are not open; their relays retry them every 5 s", "relays", len(n.Relays), "tunnels", len(set.Tunnels),
			"not_open", len(notOpen), "first", notOpen[0])
	} else {
		log.Info("local network ready", "relays", len(n.Relays), "tunnels", len(set.Tunnels))
	}
	log.Info("inspect it with", "command", inspectCommand(files, dir))
	return portHint(serveUntilSignal(sigs, gone, log, o.metricsAddr, o.profiling, reg, n.Ready, n.Drain, o.drainTimeout, n.Close))
}

// inspectCommand is the 'hoplink status' that shows a local network, run
// as this process was (bin/hoplink under make demo) from the same directory.
func inspectCommand(files []string, certs string) string {
	args := []string{shellWord(os.Args[0]), "status"}
	for _, f := range files {
		args = append(args, "-f", shellWord(f))
	}
	return strings.Join(append(args, "--certs", shellWord(certs)), " ")
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newLocalCmd(lf *logFlags) *cobra.Command {
	var files []string
	var o localRun
	cmd := &cobra.Command{
		Use:   "local -f FILE_OR_DIR",
		Short: "Run every relay of the manifests in this process, with an in-memory CA",
		Example: `  # the three-relay example network, its metrics on loopback (what make demo runs)
  hoplink local -f examples/local --metrics-addr 127.0.0.1:9464`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger()
			if err != nil {
				return err
			}
			set, err := loadManifests(files, log)
			if err != nil {
				return err
			}
			return o.run(log, lf.outputGone(), set, files, "")
		},
	}
	cmd.Flags().StringSliceVarP(&files, "file", "f", nil, "a manifest `FILE_OR_DIR` (repeatable)")
	o.flags(cmd.Flags())
	cmd.Flags().BoolVar(&o.tunOffload, "tun-offload", true, "open tun Tunnels' devices with segmentation offload where the kernel has it")
	return cmd
}

// writeObserverFiles writes ca's certificate (not its key) and a new
// observer certificate into dir, replacing those of an earlier run.
func writeObserverFiles(ca *pki.CA, dir string) error {
	for _, f := range []string{"ca.crt", pki.ObserverCert, pki.ObserverKey} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if err := ca.WriteObserver(dir); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o644)
}

func newRelayCmd(lf *logFlags) *cobra.Command {
	var (
		files                      []string
		name, metricsAddr, certDir string
		caFile, certFile, keyFile  string
		maxFlows                   int
		perTunnel, perSource       int
		profiling, tunOffload      bool
		kubeMode                   bool
		kf                         kubeFlags
		separateDial               bool
		refuseNodeEgress           bool
		drainTimeout               time.Duration
		flowLoops                  int
	)
	cmd := &cobra.Command{
		Use:   "relay (-f FILE_OR_DIR --name NAME --certs DIR | --kube --name NAME)",
		Short: "Run one relay of the manifests, or of a cluster",
		Example: `  # the relay hk of a manifest directory, with the files 'hoplink cert issue' wrote
  hoplink relay -f /etc/hoplink/manifests --name hk --certs /etc/hoplink/certs --metrics-addr 127.0.0.1:9464

  # a relay of a cluster, as the operator runs it in a pod
  hoplink relay --kube --name hk -n edge`,
		Long: `Run the relay NAME of the manifests as its own process, so relays can live on
different hosts with the same files. Certificates come from --certs DIR
(DIR/ca.crt, DIR/NAME.crt, DIR/NAME.key, as 'hoplink cert' writes them) or
from --ca, --cert and --key.

With --kube, run the relay of RelayNode NAME from the Kubernetes API instead:
the RelayNode, the Chains and Tunnels of --namespace and the certificate
Secret the operator issued, all watched and applied while the relay runs.
With --kube and --certs DIR, the certificate comes from DIR as a mounted
Secret holds it (ca.crt, tls.crt, tls.key), re-read when it changes: so
injected sidecar relays run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := lf.logger()
			if err != nil {
				return err
			}
			relayGC()
			if flowLoops < -1 {
				return fmt.Errorf("--flow-loops %d: give 0 or more (-1: one per CPU the relay uses)", flowLoops)
			}
			flow.SetLoops(flowLoops)
			sizeToContainer(log, &maxFlows, cmd.Flags().Changed("max-flows"))
			if kubeMode {
				if len(files) > 0 || caFile != "" || certFile != "" || keyFile != "" {
					return fmt.Errorf("--kube reads manifests and certificates from the cluster: drop -f, --ca, --cert and --key")
				}
				return runKubeRelay(log, &kf, name, metricsAddr, profiling, drainTimeout, kube.Options{MaxFlows: maxFlows, MaxFlowsPerTunnel: perTunnel,
					MaxFlowsPerSource: perSource, NoTUNOffload: !tunOffload, CertsDir: certDir, Version: version, Egress: nodeEgress(refuseNodeEgress)})
			}
			if name == "" {
				return fmt.Errorf("--name: required: the RelayNode this process runs")
			}
			// The manifests first: a name they lack is the mistake to
			// report, not the certificate files it would name.
			set, err := loadManifests(files, log)
			if err != nil {
				return withHostAddresses(err, name, net.InterfaceAddrs)
			}
			if set.Relay(name) == nil {
				names := set.RelayNames()
				return fmt.Errorf("--name %q: no RelayNode of that name in the manifests (they have: %s)%s", name, strings.Join(names, ", "), manifest.DidYouMean(name, names))
			}
			for _, rn := range set.Relays {
				if _, ok := rn.Annotations[local.AnnotationRTT]; ok {
					log.Info("annotation left alone here: only 'hoplink local' emulates links; these have real round trips", "relaynode", rn.Name, "annotation", local.AnnotationRTT)
				}
			}
			if certDir != "" {
				caFile = orDefault(caFile, certDir+"/ca.crt")
				certFile = orDefault(certFile, certDir+"/"+name+".crt")
				keyFile = orDefault(keyFile, certDir+"/"+name+".key")
			}
			if caFile == "" || certFile == "" || keyFile == "" {
				return fmt.Errorf("certificates: give --certs DIR, or all of --ca, --cert and --key (make them with 'hoplink cert')")
			}
			id, err := pki.LoadIdentity(name, caFile, certFile, keyFile)
			if err != nil {
				return err
			}
			sigs, release := catchExit()
			defer release()
			reg, m := newRegistry()
			r, err := relay.New(relay.Config{Name: name, Version: version, Manifests: set, Identity: id, Metrics: m, Log: log, MaxFlows: maxFlows, MaxFlowsPerTunnel: perTunnel,
				MaxFlowsPerSource: perSource, Route: true, NoTUNOffload: !tunOffload, SeparateDialPort: separateDial, Egress: nodeEgress(refuseNodeEgress)})
			if err != nil {
				return err
			}
			if err := r.Start(); err != nil {
				return portHint(err)
			}
			watched := &standaloneFiles{manifests: files, ca: caFile, cert: certFile, key: keyFile, log: log, relay: r, identity: id,
				rejected: func(what string) { m.ReloadsRejected.WithLabelValues(name, what).Inc() }}
			watched.loaded()
			stop := make(chan struct{})
			defer close(stop)
			go watched.watch(stop)
			return portHint(serveUntilSignal(sigs, lf.outputGone(), log, metricsAddr, profiling, reg, r.Ready, r.Drain, drainTimeout, r.Close))
		},
	}
	f := cmd.Flags()
	f.StringSliceVarP(&files, "file", "f", nil, "a manifest `FILE_OR_DIR` (repeatable)")
	f.StringVar(&name, "name", "", "the `NAME` of the RelayNode this process runs")
	deprecatedAlias(f, "relaynode", "name")
	f.BoolVar(&kubeMode, "kube", false, "read manifests and certificates from the Kubernetes API")
	kf.register(f)
	f.StringVar(&certDir, "certs", "", "`DIR` with ca.crt, NAME.crt and NAME.key (with --kube: ca.crt, tls.crt, tls.key)")
	f.StringVar(&caFile, "ca", "", "the CA certificate, a PEM `FILE` (default DIR/ca.crt)")
	f.StringVar(&certFile, "cert", "", "the relay's certificate, a PEM `FILE` (default DIR/NAME.crt)")
	f.StringVar(&keyFile, "key", "", "the relay's private key, a PEM `FILE` (default DIR/NAME.key)")
	metricsFlag(f, &metricsAddr)
	f.BoolVar(&profiling, "pprof", false, "also serve /debug/pprof on --metrics-addr")
	f.BoolVar(&separateDial, "separate-dial-port", false, "dial peers over QUIC from a port of its own, not the relay port: for a relay behind SNAT sharing an address with another relay (on by itself with --kube in a pod network)")
	f.IntVar(&maxFlows, "max-flows", relay.DefaultMaxFlows, "most flows this relay carries at once (in a container with a memory limit, what the limit affords)")
	f.IntVar(&perTunnel, "max-flows-per-tunnel", 0, "most flows of one Tunnel (default a quarter of --max-flows)")
	f.IntVar(&perSource, "max-flows-per-source", 0, "most flows of one Tunnel from one client host at its entry (default a sixteenth of the Tunnel's, at least 64)")
	f.BoolVar(&tunOffload, "tun-offload", true, "open tun Tunnels' devices with segmentation offload where the kernel has it")
	f.BoolVar(&refuseNodeEgress, "refuse-node-egress", false, "refuse every Tunnel's targets on this host: loopback, link-local and cloud metadata addresses and the host's own, and TUN routes over its routes (the operator sets it on host-network relays of namespaces not labelled "+egress.AllowLabel+"=true)")
	f.IntVar(&flowLoops, "flow-loops", -1, "event loops that carry flows between two sockets (TCP clients and targets, TLS links), each woken once for all its flows' messages (-1: one per CPU the relay uses; 0: none, a goroutine per flow direction)")
	drainFlag(f, &drainTimeout)
	return cmd
}

// nodeEgress is the egress policy of --refuse-node-egress.
func nodeEgress(refuse bool) *egress.Policy {
	if refuse {
		return egress.NodePolicy()
	}
	return nil
}

func orDefault(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// relayGC collects garbage at 50% heap growth rather than Go's 100%, unless
// GOGC says otherwise. A relay's live heap is small (buffers in flight), so
// collecting twice as often costs little CPU, and the headroom it saves is
// most of what a relay holds beyond its binary.
func relayGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
}
