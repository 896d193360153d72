package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of hoplink and of its QUIC library",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			quic := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, d := range bi.Deps {
					if d.Path == "github.com/quic-go/quic-go" {
						quic = d.Version
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "hoplink %s (%s, quic-go %s, %s/%s)\n", version, runtime.Version(), quic, runtime.GOOS, runtime.GOARCH)
		},
	}
}
