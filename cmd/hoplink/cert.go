package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
)

func newCertCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Make a CA and relay certificates for standalone relays",
	}
	var dir string
	ca := &cobra.Command{
		Use:   "ca --certs DIR",
		Short: "Create a CA: DIR/ca.crt and DIR/ca.key",
		Args:  cobra.NoArgs,
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
		Use:   "issue --certs DIR (NAME... | -f FILE_OR_DIR [NAME...])",
		Short: "Issue certificates for relays: DIR/NAME.crt and DIR/NAME.key, signed by DIR/ca.*",
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
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/%s.crt and %s/%s.key\n", dir, n, dir, n)
			}
			return nil
		},
	}
	observer := &cobra.Command{
		Use:   "observer --certs DIR",
		Short: "Issue the certificate 'hoplink status' and 'probe' read relays with: DIR/observer.crt and DIR/observer.key",
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
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/%s and %s/%s\n", dir, pki.ObserverCert, dir, pki.ObserverKey)
			return nil
		},
	}
	issue.Flags().StringSliceVarP(&files, "file", "f", nil, "manifest file or directory (repeatable): the RelayNodes to issue for")
	for _, c := range []*cobra.Command{ca, issue, observer} {
		c.Flags().StringVar(&dir, "certs", "certs", "`DIR` of the certificate files, as 'hoplink relay --certs' reads them")
		deprecatedAlias(c.Flags(), "dir", "certs")
	}
	cmd.AddCommand(ca, issue, observer)
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
