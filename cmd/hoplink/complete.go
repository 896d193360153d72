package main

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoplink/hoplink/manifest"
)

// addCompletions gives shell completion (cobra's 'hoplink completion
// bash|zsh|fish|powershell') the values of every flag that takes one of a
// few, by the flag's name, so that one name completes alike in every
// command: manifest files for -f, directories for --certs, relay names
// from the -f manifests for --name, and the words -o and the log flags
// accept.
func addCompletions(root *cobra.Command) {
	fixed := map[string][]string{
		"output":            {"table", "json", "yaml"},
		"log-level":         {"debug", "info", "warn", "error"},
		"log-format":        {"text", "json"},
		"privileged-relays": {"namespace-label", "any"},
		"protocol":          {"tcp", "udp"},
	}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		register := func(f *pflag.Flag) {
			if f.Deprecated != "" {
				return
			}
			switch f.Name {
			case "file":
				must(c.MarkFlagFilename(f.Name, "yaml", "yml", "json"))
			case "certs", "observer-certs":
				must(c.MarkFlagDirname(f.Name))
			case "ca", "cert":
				must(c.MarkFlagFilename(f.Name, "crt", "pem"))
			case "key":
				must(c.MarkFlagFilename(f.Name, "key", "pem"))
			case "kubeconfig":
				must(c.MarkFlagFilename(f.Name))
			case "name":
				must(c.RegisterFlagCompletionFunc(f.Name, fromManifests(relayNames)))
			default:
				if words, ok := fixed[f.Name]; ok {
					must(c.RegisterFlagCompletionFunc(f.Name, oneOf(words)))
				}
			}
		}
		c.LocalNonPersistentFlags().VisitAll(register)
		c.PersistentFlags().VisitAll(register)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// oneOf completes with the words that start with what was typed.
func oneOf(words []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var out []cobra.Completion
		for _, w := range words {
			if strings.HasPrefix(w, toComplete) {
				out = append(out, w)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// fromManifests completes with what list finds in the manifests the
// command line's -f names (read as they are: a file still being written
// gives the objects it has so far), leaving out arguments already given.
func fromManifests(list func(set *manifest.Set, cmd *cobra.Command) []string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		files, _ := cmd.Flags().GetStringSlice("file")
		if len(files) == 0 {
			return cobra.AppendActiveHelp(nil, "names come from the manifests: give -f FILE_OR_DIR first"), cobra.ShellCompDirectiveNoFileComp
		}
		set, _ := manifest.Read(files...)
		if set == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, n := range list(set, cmd) {
			if strings.HasPrefix(n, toComplete) && !slices.Contains(args, n) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func relayNames(set *manifest.Set, _ *cobra.Command) []string { return set.RelayNames() }

// chainNames are the chains as 'probe' takes them: NAME in --namespace
// (default "default"), NAMESPACE/NAME in another.
func chainNames(set *manifest.Set, cmd *cobra.Command) []string {
	ns, _ := cmd.Flags().GetString("namespace")
	if ns == "" {
		ns = manifest.DefaultNamespace
	}
	var out []string
	for _, c := range set.Chains {
		if c.Namespace == ns {
			out = append(out, c.Name)
		} else {
			out = append(out, manifest.Key(c.Namespace, c.Name))
		}
	}
	return out
}
