package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/adminapi"
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
}

func (o *observeFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVarP(&o.files, "file", "f", nil, "manifest file or directory (repeatable): the relays to ask and their endpoints")
	f.StringVar(&o.certs, "certs", "", "directory with ca.crt and the observer's certificate (observer.crt, observer.key; `hoplink cert observer`, or `hoplink local --observer-certs`)")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to wait for each relay's answer")
}

// load reads the manifests and the observer's identity, and checks the
// output format, before anything is asked.
func (o *observeFlags) load() (*manifest.Set, *adminapi.Client, error) {
	switch o.output {
	case "table", "json", "yaml":
	default:
		return nil, nil, fmt.Errorf("-o %q: want table, json or yaml", o.output)
	}
	if o.certs == "" {
		return nil, nil, errors.New("--certs: required: the directory with ca.crt, observer.crt and observer.key (make them with `hoplink cert observer --dir DIR`)")
	}
	if len(o.files) == 0 {
		return nil, nil, errors.New("-f: name the manifest files or directories of the relays to ask")
	}
	set, err := manifest.Load(o.files...)
	if err != nil {
		return nil, nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(o.certs, "ca.crt"))
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: %w", err)
	}
	roots, err := pki.ParseRoots(caPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: %s: %w", filepath.Join(o.certs, "ca.crt"), err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(o.certs, pki.ObserverCert), filepath.Join(o.certs, pki.ObserverKey))
	if err != nil {
		return nil, nil, fmt.Errorf("--certs: the observer's certificate: %w (make it with `hoplink cert observer --dir %s`)", err, o.certs)
	}
	return set, adminapi.NewClient(roots, func() (*tls.Certificate, error) { return &cert, nil }), nil
}

// write renders v as the output format asks; table renders tables.
func (o *observeFlags) write(w io.Writer, v any, table func(io.Writer) error) error {
	switch o.output {
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

// errNotReady makes `status --wait` exit non-zero.
var errNotReady = errors.New("not ready")

func newStatusCmd() *cobra.Command {
	var of observeFlags
	var watch, wait bool
	var interval, waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "status -f FILE_OR_DIR --certs DIR",
		Short: "Show the relays, their links, each chain's route and candidates, and each Tunnel, as the relays see them now",
		Long: `Asks every relay of the manifests for its status over its admin API, with the
observer's certificate (never a relay's): whether it is ready, its links to its
next hops (round trip, jitter, loss, transport), the route of each chain it
enters and the candidates of the last round, and its Tunnels' listeners.

--wait polls until every relay answers ready, every chain has a route whose
links are up and every Tunnel listens (exit 0), or --wait-timeout passes
(exit 1); --watch prints the status every --interval until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set, client, err := of.load()
			if err != nil {
				return err
			}
			gather := func() *observe.Report {
				ctx, cancel := context.WithTimeout(cmd.Context(), of.timeout)
				defer cancel()
				return observe.Gather(ctx, set, client)
			}
			out := cmd.OutOrStdout()
			show := func(r *observe.Report) error {
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
			return show(gather())
		},
	}
	of.add(cmd)
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print the status again every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "with --watch, how often")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until everything is ready (exit 0) or --wait-timeout passes (exit 1), for scripts")
	cmd.Flags().DurationVar(&waitFor, "wait-timeout", 2*time.Minute, "with --wait, how long")
	return cmd
}

func newProbeCmd() *cobra.Command {
	var of observeFlags
	cmd := &cobra.Command{
		Use:   "probe CHAIN -f FILE_OR_DIR --certs DIR",
		Short: "Measure a chain now, hop by hop: each link of its route, the exit to its targets, and the route and every candidate end to end",
		Long: `Like traceroute through the real relays: each relay of the chain's current
route probes its link to the next now; the exit connects to the chain's
targets; and the entry sends traces along the route and along every candidate
of its last round, end to end, as a flow would travel. CHAIN is NAME (in the
default namespace) or NAMESPACE/NAME.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, client, err := of.load()
			if err != nil {
				return err
			}
			// Probes and traces take up to a round each; give them room.
			ctx, cancel := context.WithTimeout(cmd.Context(), of.timeout+10*time.Second)
			defer cancel()
			p, err := observe.ProbeChain(ctx, set, client, args[0])
			if err != nil {
				return err
			}
			return of.write(cmd.OutOrStdout(), p, func(w io.Writer) error { return observe.WriteProbe(w, p) })
		},
	}
	of.add(cmd)
	return cmd
}
