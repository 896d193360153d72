package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() { version = buildVersion(version, debug.ReadBuildInfo) }

// buildVersion is the version set at build time, or else the module's
// version Go recorded: 'go install .../cmd/hoplink@v1.2.3' sets no
// ldflags, and its binary should still say v1.2.3.
func buildVersion(set string, info func() (*debug.BuildInfo, bool)) string {
	if set != "dev" {
		return set
	}
	if bi, ok := info(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return set
}

// versionLine is what 'hoplink version' and 'hoplink --version' print.
func versionLine() string {
	quic := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/quic-go/quic-go" {
				quic = d.Version
			}
		}
	}
	return fmt.Sprintf("hoplink %s (%s, quic-go %s, %s/%s)\n", version, runtime.Version(), quic, runtime.GOOS, runtime.GOARCH)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version of hoplink and of its QUIC library",
		Example: `  hoplink version`,
		Args:    cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), versionLine())
		},
	}
}
