package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
)

func newCertCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Make, show and renew the CA and the certificates of standalone relays",
		Example: `  hoplink cert ca --certs certs
  hoplink cert issue --certs certs -f manifests/
  hoplink cert observer --certs certs
  hoplink cert show --certs certs`,
	}
	var dir string
	ca := &cobra.Command{
		Use:     "ca [--certs DIR]",
		Short:   "Create a CA: DIR/ca.crt and DIR/ca.key",
		Example: `  hoplink cert ca --certs certs`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := pki.NewCA("hoplink CA")
			if err != nil {
				return err
			}
			if err := c.WriteCA(dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/ca.crt and %s/ca.key (keep ca.key secret)\n", dir, dir)
			return nil
		},
	}
	var files []string
	issue := &cobra.Command{
		Use:   "issue [--certs DIR] (NAME... | -f FILE_OR_DIR [NAME...])",
		Short: "Issue certificates for relays: DIR/NAME.crt and DIR/NAME.key, signed by DIR/ca.*",
		Example: `  # every RelayNode of the manifests
  hoplink cert issue --certs certs -f manifests/

  # two relays, by name
  hoplink cert issue --certs certs hk la`,
		Long: `Issues a certificate for each relay NAME, signed by the CA in DIR. With -f,
the names are checked against the RelayNodes of the manifests, and without
names every RelayNode of them gets one.`,
		ValidArgsFunction: fromManifests(relayNames),
		RunE: func(cmd *cobra.Command, names []string) error {
			names, err := relaysToIssue(names, files)
			if err != nil {
				return err
			}
			c, err := pki.LoadCA(dir+"/ca.crt", dir+"/ca.key")
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := c.WriteRelay(dir, n); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/%s.crt and %s/%s.key (valid until %s)\n", dir, n, dir, n, validUntil(filepath.Join(dir, n+".crt")))
			}
			return nil
		},
	}
	var output string
	var renewBefore time.Duration
	show := &cobra.Command{
		Use:   "show [--certs DIR] [NAME...]",
		Short: "Show the certificates of DIR: whose each is, how long it is valid, and when 'cert renew' renews it",
		Example: `  hoplink cert show --certs certs
  hoplink cert show --certs certs hk -o json`,
		Long: `Lists DIR/NAME.crt for each NAME, or every certificate of DIR: the CA, relays
and the observer, with the dates each is valid between, the days left, when
'hoplink cert renew' renews it (--renew-before ahead of its expiry, a third of
its validity unless given), and its state: valid, expires soon (within 30
days), renew (due for renewal), expired, not yet valid (this host's clock is
behind its issuer's), or not from this CA (issued by another CA than
DIR/ca.crt, as during a CA rotation).`,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: certNames(&dir),
		RunE: func(cmd *cobra.Command, names []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			now := time.Now()
			files, err := readCertFiles(dir, names, now, renewBefore)
			if err != nil {
				return err
			}
			return writeAs(cmd.OutOrStdout(), output, files, func(w io.Writer) error { return writeCertTable(w, files, now) })
		},
	}
	show.Flags().StringVarP(&output, "output", "o", "table", "output `FORMAT`: table, json or yaml")
	var force, newKey bool
	renew := &cobra.Command{
		Use:   "renew [--certs DIR] [NAME...]",
		Short: "Renew the certificates of DIR that are due: relays' and the observer's, signed by DIR/ca.*",
		Example: `  # those due, from a daily timer
  hoplink cert renew --certs certs

  # one relay now, with a new key
  hoplink cert renew --certs certs hk --force --new-key`,
		Long: `Issues again, for as long as 'cert issue' and 'cert observer' do (a year, the
observer 90 days), each certificate of DIR (or DIR/NAME.crt for each NAME) that
is due: within --renew-before of its expiry (a third of its
validity unless given: the operator's rule), expired, or not from the CA of
DIR/ca.crt. A relay's certificate keeps its key unless --new-key, so only
NAME.crt changes, in one rename that a running relay reads within 2 s, without
a restart. Copy the renewed files to the relays' hosts the same way. --force
renews every one. The CA itself is not renewed: see the CA rotation steps in
docs/architecture.md.`,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: certNames(&dir),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
			if err != nil {
				return err
			}
			now := time.Now()
			files, err := readCertFiles(dir, names, now, renewBefore)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, f := range files {
				if f.Kind == kindCA {
					if len(names) > 0 || f.State != stateValid {
						fmt.Fprintf(out, "%s: the CA, valid until %s (%s): not renewed here; rotate it as docs/architecture.md says\n", f.File, f.NotAfter.UTC().Format(time.DateOnly), left(f.NotAfter, now))
					}
					continue
				}
				if !force && !f.due() {
					fmt.Fprintf(out, "%s: valid until %s (%s), due for renewal from %s: left as it is\n", f.File, f.NotAfter.UTC().Format(time.DateOnly), left(f.NotAfter, now), f.RenewFrom.UTC().Format(time.DateOnly))
					continue
				}
				until, err := renewCert(c, dir, f, newKey)
				if err != nil {
					return fmt.Errorf("%s: %w", f.File, err)
				}
				fmt.Fprintf(out, "%s: renewed, valid until %s (was %s, until %s)\n", f.File, until.UTC().Format(time.DateOnly), f.State, f.NotAfter.UTC().Format(time.DateOnly))
			}
			return nil
		},
	}
	renew.Flags().BoolVar(&force, "force", false, "renew every certificate, due or not")
	renew.Flags().BoolVar(&newKey, "new-key", false, "make relays new keys too (the key file changes with the certificate)")
	for _, c := range []*cobra.Command{show, renew} {
		c.Flags().DurationVar(&renewBefore, "renew-before", 0, "renew certificates this long before expiry (default: a third of their validity)")
	}
	observer := &cobra.Command{
		Use:     "observer [--certs DIR]",
		Short:   "Issue the certificate 'hoplink status' and 'probe' read relays with: DIR/observer.crt and DIR/observer.key",
		Example: `  hoplink cert observer --certs certs`,
		Long: `Issues a client certificate for the observer, signed by DIR/ca.*: relays let it
read their status and measure chains over their admin API, nothing else. It is
no relay's certificate and cannot carry flows.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := pki.LoadCA(dir+"/ca.crt", dir+"/ca.key")
			if err != nil {
				return err
			}
			if err := c.WriteObserver(dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/%s and %s/%s (valid until %s)\n", dir, pki.ObserverCert, dir, pki.ObserverKey, validUntil(filepath.Join(dir, pki.ObserverCert)))
			return nil
		},
	}
	issue.Flags().StringSliceVarP(&files, "file", "f", nil, "a manifest `FILE_OR_DIR` (repeatable): the RelayNodes to issue for")
	for _, c := range []*cobra.Command{ca, issue, observer, show, renew} {
		c.Flags().StringVar(&dir, "certs", "certs", "`DIR` of the certificate files, as 'hoplink relay --certs' reads them")
		deprecatedAlias(c.Flags(), "dir", "certs")
	}
	cmd.AddCommand(ca, issue, observer, show, renew)
	return cmd
}

// relaysToIssue checks the names 'cert issue' was given: each must be a
// relay name, and with manifests one of their RelayNodes; no name with
// manifests means all of them.
func relaysToIssue(names, files []string) ([]string, error) {
	if len(files) == 0 && len(names) == 0 {
		return nil, fmt.Errorf("name at least one relay, or give -f FILE_OR_DIR to issue for every RelayNode of the manifests")
	}
	for _, n := range names {
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			return nil, fmt.Errorf("relay name %q: %s (it must match a RelayNode's metadata.name)", n, strings.Join(msgs, "; "))
		}
	}
	if len(files) == 0 {
		return names, nil
	}
	set, err := manifest.Load(files...)
	if err != nil {
		return nil, err
	}
	known := set.RelayNames()
	if len(names) == 0 {
		return known, nil
	}
	for _, n := range names {
		if set.Relay(n) == nil {
			return nil, fmt.Errorf("relay name %q: no RelayNode of that name in the manifests (they have: %s)%s", n, strings.Join(known, ", "), manifest.DidYouMean(n, known))
		}
	}
	return names, nil
}

// validUntil is a certificate file's expiry, as the cert commands print it.
func validUntil(path string) string {
	c, err := readCert(path)
	if err != nil {
		return "?"
	}
	return c.NotAfter.UTC().Format(time.DateOnly)
}

// certNames completes the names of DIR's certificates (DIR from --certs).
func certNames(dir *string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		entries, _ := os.ReadDir(*dir)
		var out []cobra.Completion
		for _, e := range entries {
			n, ok := strings.CutSuffix(e.Name(), ".crt")
			if ok && strings.HasPrefix(n, toComplete) && !slices.Contains(args, n) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
