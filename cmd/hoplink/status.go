package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/controllers"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/observe"
	"github.com/hoplink/hoplink/pki"
)

// observeFlags are what `status` and `probe` share: where the manifests
// and the observer's certificate are, the output format, and how long to
// wait for a relay.
type observeFlags struct {
	files   []string
	certs   string
	output  string
	timeout time.Duration
	// In a cluster: the objects from the API, the relays at the endpoints
	// their status publishes, with an observer certificate issued in
	// memory from the CA Secret (reading it takes an admin's rights).
	kube     bool
	kf       kubeFlags
	caSecret string
	api      client.Client // set by load with --kube
	// apiOnly: with --kube, ask no relay; notAsked says why none is
	// asked (set by load: --api-only, or no rights to the CA Secret).
	apiOnly  bool
	notAsked string

	// Set by load: the CAs and certificate this command uses, and what
	// to do about a relay's certificate near its expiry.
	inUse    []certInUse
	relayFix func(relay string) string
	// relayWarning is how close to its expiry a relay's certificate is
	// warned of (observe.CertWarning when zero).
	relayWarning time.Duration
	// badManifests is why the manifests did not load whole: status and
	// probe then ask the relays of what could be read (the relays keep
	// running what they last accepted).
	badManifests error
}

func (o *observeFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&o.kube, "kube", false, "read a cluster: the objects of --namespace from the API, and the relays through their admin API with a certificate issued in memory from --ca-secret")
	o.kf.register(f)
	f.StringVar(&o.caSecret, "ca-secret", "hoplink-system/hoplink-ca", "with --kube, the Secret `NAMESPACE/NAME` holding the relay CA")
	f.BoolVar(&o.apiOnly, "api-only", false, "with --kube, show what the API says (the operator's view, at most 10 s old) and ask no relay: needs no rights to --ca-secret, which --kube otherwise reads (and falls back to this when forbidden)")
	f.StringSliceVarP(&o.files, "file", "f", nil, "a manifest `FILE_OR_DIR` (repeatable): the relays to ask and their endpoints")
	f.StringVar(&o.certs, "certs", "", "`DIR` with ca.crt and the observer's certificate (observer.crt, observer.key), as 'hoplink cert observer' writes them, or 'hoplink local' (which logs the command)")
	f.StringVarP(&o.output, "output", "o", "table", "output `FORMAT`: table, json or yaml")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to wait for each relay's answer")
}

// load reads the manifests and the observer's identity, and checks the
// output format, before anything is asked.
func (o *observeFlags) load(ctx context.Context) (*manifest.Set, []observe.Object, *adminapi.Client, error) {
	if err := checkOutput(o.output); err != nil {
		return nil, nil, nil, err
	}
	if !o.kube && len(o.files) == 0 && filepath.Base(os.Args[0]) == "kubectl-hoplink" {
		o.kube = true // `kubectl hoplink status`: kubectl runs plugins by that name
	}
	if o.kube {
		return o.loadKube(ctx)
	}
	set, c, err := o.loadFiles()
	return set, nil, c, err
}

// loadKube reads the cluster's objects and issues an observer certificate
// from its CA.
func (o *observeFlags) loadKube(ctx context.Context) (*manifest.Set, []observe.Object, *adminapi.Client, error) {
	if len(o.files) > 0 || o.certs != "" {
		return nil, nil, nil, errors.New("--kube reads the cluster: leave out -f and --certs")
	}
	ns, name, ok := strings.Cut(o.caSecret, "/")
	if !ok || ns == "" || name == "" {
		return nil, nil, nil, fmt.Errorf("--ca-secret %q: want NAMESPACE/NAME", o.caSecret)
	}
	cfg, err := o.kf.config()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes config: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return nil, nil, nil, err
	}
	o.api = c
	set, objs, err := observe.FromCluster(ctx, c, o.kf.ns("default"))
	if err != nil {
		return nil, nil, nil, err
	}
	// The CA's key issues the observer's certificate: only who may read it
	// asks the relays. Anyone else gets the API's view, which needs no key.
	if o.apiOnly {
		o.notAsked = "--api-only: this is what the operator last heard from them (every 10 s)"
		return set, objs, nil, nil
	}
	ca, err := controllers.LoadOrCreateCA(ctx, c, types.NamespacedName{Namespace: ns, Name: name}, false)
	if apierrors.IsForbidden(err) {
		o.notAsked = fmt.Sprintf("no rights to read --ca-secret %s, whose key issues the observer's certificate: this is what the operator last heard from them (every 10 s)", o.caSecret)
		return set, objs, nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--ca-secret: %w", err)
	}
	cert, err := ca.IssueObserver(time.Hour)
	if err != nil {
		return nil, nil, nil, err
	}
	roots, err := pki.ParseRoots(ca.TrustPEM())
	if err != nil {
		return nil, nil, nil, err
	}
	o.inUse = casInUse(ca.TrustPEM(), "Secret "+o.caSecret, "rotate it before then (docs/architecture.md: rotating the operator's CA)")
	o.relayFix = func(string) string {
		return "the operator renews it when a third of its validity is left: see the RelayNode's conditions and the operator's log"
	}
	// Relays in a cluster hold certificates of days (Secrets) or a day
	// (pod certificates), renewed 56 and 8 hours before they expire: one
	// with less left than clusterRelayWarning was not renewed.
	o.relayWarning = clusterRelayWarning
	return set, objs, adminapi.NewClient(roots, func() (*tls.Certificate, error) { return &cert, nil }), nil
}

func (o *observeFlags) loadFiles() (*manifest.Set, *adminapi.Client, error) {
	if o.certs == "" {
		return nil, nil, errors.New("--certs: required: the directory with ca.crt, observer.crt and observer.key (make them with 'hoplink cert observer --certs DIR')")
	}
	if len(o.files) == 0 {
		return nil, nil, errors.New("-f: name the manifest files or directories of the relays to ask")
	}
	set, err := manifest.Load(o.files...)
	if err != nil {
		// A manifest with an error is when relays are asked most: they
		// keep running the ones they accepted before. Their endpoints are
		// what status needs.
		partial, _ := manifest.Read(o.files...)
		if partial == nil || len(partial.Relays) == 0 {
			return nil, nil, err
		}
		set, o.badManifests = partial, err
	}
	caFile := filepath.Join(o.certs, "ca.crt")
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: %w (copy there the ca.crt of the relays' CA, with the observer's certificate: 'hoplink cert observer --certs DIR' where the CA is)", err)
	}
	roots, err := pki.ParseRoots(caPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: %s: %w", caFile, err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(o.certs, pki.ObserverCert), filepath.Join(o.certs, pki.ObserverKey))
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: the observer's certificate: %w (make it with 'hoplink cert observer --certs %s')", err, o.certs)
	}
	o.inUse = append(casInUse(caPEM, caFile, "rotate it before then (docs/architecture.md: rotating the CA of standalone relays)"),
		certInUse{what: "the observer's certificate (" + filepath.Join(o.certs, pki.ObserverCert) + ")", notAfter: cert.Leaf.NotAfter,
			fix: fmt.Sprintf("renew it: hoplink cert renew --certs %s observer", o.certs)})
	o.relayFix = func(relay string) string {
		return fmt.Sprintf("renew it where the CA's key is (hoplink cert renew --certs DIR %s) and copy %s.crt to its host", relay, relay)
	}
	return set, adminapi.NewClient(roots, func() (*tls.Certificate, error) { return &cert, nil }), nil
}

// certInUse is a certificate 'status' trusts or presents, which it warns
// of before it expires.
type certInUse struct {
	what     string
	notAfter time.Time
	fix      string
}

// casInUse are the CAs of a trust bundle.
func casInUse(bundle []byte, where, fix string) []certInUse {
	var out []certInUse
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, certInUse{what: fmt.Sprintf("the CA %q (%s)", c.Subject.CommonName, where), notAfter: c.NotAfter, fix: fix})
		}
	}
}

// clusterRelayWarning is how close to its expiry `status --kube` warns of a
// relay's certificate.
const clusterRelayWarning = 6 * time.Hour

// certWarnings are the certificates in use that expire within
// observe.CertWarning of now (or have): each relay's, as it reports it,
// and the CAs and observer certificate of this command.
func (o *observeFlags) certWarnings(r *observe.Report, now time.Time) []string {
	var out []string
	if o.badManifests != nil {
		out = append(out, fmt.Sprintf("the manifests do not load (relays reloading them keep the ones they run); asked the relays of the documents that could be read: %v",
			strings.ReplaceAll(o.badManifests.Error(), "\n", "; ")))
	}
	warn := func(what string, notAfter time.Time, fix string, within time.Duration) {
		switch d := notAfter.Sub(now); {
		case d < 0:
			out = append(out, fmt.Sprintf("%s expired on %s: %s", what, notAfter.UTC().Format(time.DateOnly), fix))
		case d < within:
			out = append(out, fmt.Sprintf("%s expires on %s (in %s): %s", what, notAfter.UTC().Format(time.DateOnly), left(notAfter, now), fix))
		}
	}
	for _, rl := range r.Relays {
		if s := rl.Status; s != nil && !s.CertificateExpires.IsZero() {
			within := o.relayWarning
			if within == 0 {
				within = observe.CertWarning
			}
			warn("relay "+rl.Name+"'s certificate", s.CertificateExpires, o.relayFix(rl.Name), within)
		}
	}
	for _, c := range o.inUse {
		warn(c.what, c.notAfter, c.fix, observe.CertWarning)
	}
	return out
}

// write renders v as the output format asks; table renders tables.
func (o *observeFlags) write(w io.Writer, v any, table func(io.Writer) error) error {
	return writeAs(w, o.output, v, table)
}

// checkOutput checks an -o value before anything is done.
func checkOutput(format string) error {
	switch format {
	case "table", "json", "yaml":
		return nil
	}
	return fmt.Errorf("-o %q: want table, json or yaml", format)
}

// writeAs renders v as JSON or YAML, or calls table.
func writeAs(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return table(w)
}

// errNotReady makes `status` exit non-zero.
var errNotReady = errors.New("not ready")

func newStatusCmd() *cobra.Command {
	var of observeFlags
	var watch, wait, graph bool
	var interval, waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "status (-f FILE_OR_DIR --certs DIR | --kube)",
		Short: "Show the relays, their links, each chain's route and candidates, and each Tunnel, as the relays see them now",
		Example: `  # standalone relays
  hoplink status -f manifests/ --certs certs

  # a cluster's, until all is ready, for a script
  hoplink status --kube -n edge --wait --wait-timeout 5m

  # a map of the network, drawn
  hoplink status -f manifests/ --certs certs --graph | dot -Tsvg > network.svg`,
		Long: `Asks every relay of the manifests for its status over its admin API, with the
observer's certificate (never a relay's): whether it is ready, its links to its
next hops (round trip, jitter, loss, transport), the route of each chain it
enters and the candidates of the last round, and its Tunnels' listeners.

It exits 1 when anything is not ready: a relay that does not answer or is
not ready, a chain without a route whose links are up, a Tunnel that does not
listen or whose exit cannot connect to its target (each listed with its
reason). --wait polls until all is ready (exit 0), or --wait-timeout passes
(exit 1); --watch prints the status every --interval until interrupted.
--graph prints the same as a map, in Graphviz's DOT:

  hoplink status -f DIR --certs DIR --graph | dot -Tsvg > network.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if graph && of.output != "table" {
				return fmt.Errorf("--graph writes a DOT graph: leave out -o %s", of.output)
			}
			set, objs, client, err := of.load(cmd.Context())
			if err != nil {
				return err
			}
			rounds := 0
			gather := func() *observe.Report {
				ctx, cancel := context.WithTimeout(cmd.Context(), of.timeout)
				defer cancel()
				if rounds++; of.kube && rounds > 1 {
					// Each round after the first reads the API again.
					if set, objs, err = observe.FromCluster(ctx, of.api, of.kf.ns("default")); err != nil {
						return &observe.Report{Time: time.Now().UTC(), NotReady: []string{err.Error()}}
					}
				}
				var r *observe.Report
				if client == nil {
					r = observe.FromAPI(objs, of.notAsked)
				} else {
					r = observe.Gather(ctx, set, client)
					if of.kube {
						r.WithAPI(objs)
					}
				}
				if of.kube {
					r.Imports, _ = observe.ImportsFromCluster(ctx, of.api, of.kf.ns("default"))
				}
				r.Warnings = of.certWarnings(r, time.Now())
				return r
			}
			out := cmd.OutOrStdout()
			show := func(r *observe.Report) error {
				if graph {
					return observe.WriteGraph(out, r)
				}
				return of.write(out, r, func(w io.Writer) error { return observe.WriteReport(w, r) })
			}
			switch {
			case wait:
				deadline := time.Now().Add(waitFor)
				for {
					r := gather()
					if r.Ready || time.Now().After(deadline) {
						if err := show(r); err != nil {
							return err
						}
						if !r.Ready {
							cmd.SilenceUsage = true
							return fmt.Errorf("%w after %v: %d problems (listed above)", errNotReady, waitFor, len(r.NotReady))
						}
						return nil
					}
					select {
					case <-cmd.Context().Done():
						return cmd.Context().Err()
					case <-time.After(time.Second):
					}
				}
			case watch:
				for {
					if err := show(gather()); err != nil {
						return err
					}
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(interval):
					}
					fmt.Fprintln(out)
				}
			}
			r := gather()
			if err := show(r); err != nil {
				return err
			}
			if !r.Ready {
				cmd.SilenceUsage = true
				return fmt.Errorf("%w: %d problems (listed above)", errNotReady, len(r.NotReady))
			}
			return nil
		},
	}
	of.add(cmd)
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print the status again every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "with --watch, how often")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until everything is ready (exit 0) or --wait-timeout passes (exit 1), for scripts")
	cmd.Flags().DurationVar(&waitFor, "wait-timeout", 2*time.Minute, "with --wait, how long")
	cmd.Flags().BoolVar(&graph, "graph", false, "print a map of the network as a Graphviz DOT graph (relays, their links with round trip, loss and state, the chains' routes in bold): render it with dot -Tsvg")
	return cmd
}

func newProbeCmd() *cobra.Command {
	var of observeFlags
	cmd := &cobra.Command{
		Use:   "probe CHAIN (-f FILE_OR_DIR --certs DIR | --kube)",
		Short: "Measure a chain now, hop by hop: each link of its route, the exit to its targets, and the route and every candidate end to end",
		Example: `  hoplink probe fastest -f examples/local --certs certs
  hoplink probe edge/to-east --kube -o json`,
		Long: `Like traceroute through the real relays: each relay of the chain's current
route probes its link to the next now; the exit connects to the chain's
targets; and the entry sends traces along the route and along every candidate
of its last round, end to end, as a flow would travel. CHAIN is NAME (in
--namespace, default "default") or NAMESPACE/NAME. It exits 1 when a part
failed (a link, a target, a route end to end), saying why for each.`,
		Args: func(cmd *cobra.Command, args []string) error { return probeArgs(cmd, args, of.files) },
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return fromManifests(chainNames)(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			set, _, client, err := of.load(cmd.Context())
			if err != nil {
				return err
			}
			if client == nil {
				return fmt.Errorf("probe measures through the relays, which take an observer's certificate; relays not asked: %s", of.notAsked)
			}
			// Probes and traces take up to a round each; give them room.
			ctx, cancel := context.WithTimeout(cmd.Context(), of.timeout+10*time.Second)
			defer cancel()
			p, err := observe.ProbeChain(ctx, set, client, args[0], of.kf.ns("default"))
			if err != nil {
				return err
			}
			if err := of.write(cmd.OutOrStdout(), p, func(w io.Writer) error { return observe.WriteProbe(w, p) }); err != nil {
				return err
			}
			if failed := p.Failures(); len(failed) > 0 {
				cmd.SilenceUsage = true
				return fmt.Errorf("%d part(s) of chain %s failed: %s", len(failed), p.Chain, strings.Join(failed, "; "))
			}
			return nil
		},
	}
	of.add(cmd)
	return cmd
}

// probeArgs wants one CHAIN, and when it has not one, lists those of the
// -f manifests to choose from: cobra's "accepts 1 arg(s)" left the user
// to find them.
func probeArgs(cmd *cobra.Command, args, files []string) error {
	if len(args) == 1 {
		return nil
	}
	what := "name the CHAIN to probe"
	if len(args) > 1 {
		what = fmt.Sprintf("probe takes one CHAIN, not %d (%s)", len(args), strings.Join(args, ", "))
	}
	if len(files) == 0 {
		return fmt.Errorf("%s: hoplink probe CHAIN -f FILE_OR_DIR --certs DIR (or --kube; 'kubectl get chains -A' lists a cluster's)", what)
	}
	set, _ := manifest.Read(files...)
	if set == nil || len(set.Chains) == 0 {
		return fmt.Errorf("%s: the manifests of -f %s have no Chain to probe", what, strings.Join(files, ","))
	}
	names := chainNames(set, cmd)
	return fmt.Errorf("%s, one of the manifests': %s (e.g. hoplink probe %s -f FILE_OR_DIR --certs DIR)", what, strings.Join(names, ", "), names[0])
}
