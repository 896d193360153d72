// Command hoplink runs hoplink relays: all of a manifest set in one process
// (local), or one relay of it (relay), and makes their certificates (cert).
package main

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "hoplink:", err)
		os.Exit(1)
	}
}

type logFlags struct {
	level  string
	format string
}

func (f *logFlags) logger() (*slog.Logger, error) {
	l, err := f.loggerTo(os.Stderr)
	if err == nil {
		// Libraries that print through the standard logger (quic-go's
		// socket buffer warning) come out as this process's warnings, in
		// its format.
		log.SetFlags(0)
		log.SetOutput(stdLog{l})
	}
	return l, err
}

// stdLog turns the standard logger's lines into warnings.
type stdLog struct{ l *slog.Logger }

func (w stdLog) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)), "via", "log")
	return len(p), nil
}

func (f *logFlags) loggerTo(out io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(f.format) {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", f.format)
}

func newRoot() *cobra.Command {
	lf := &logFlags{}
	root := &cobra.Command{
		Use:           "hoplink",
		Short:         "Carry TCP, UDP and IP subnets across multi-hop chains of relays",
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version, as well as the version command: what most tools take.
		Version: version,
	}
	root.SetVersionTemplate(versionLine())
	root.PersistentFlags().StringVar(&lf.level, "log-level", "info", "debug, info, warn or error")
	root.PersistentFlags().StringVar(&lf.format, "log-format", "text", "text or json")
	root.AddCommand(newLocalCmd(lf), newForwardCmd(lf), newRelayCmd(lf), newOperatorCmd(lf), newCertCmd(), newStatusCmd(), newProbeCmd(), newVersionCmd())
	addCompletions(root)
	return root
}
