// Command hoplink runs hoplink relays: all of a manifest set in one process
// (local), or one relay of it (relay), and makes their certificates (cert).
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/hoplink/hoplink/internal/logs"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stderr))
}

// runMain is main, with its arguments and standard error given: it returns the
// exit code. Under --log-format json, everything it writes to stderr is a
// JSON record: the error that ends it, a panic of the main goroutine with
// its stack, and what cobra and pflag print there (a deprecated flag's
// warning).
func runMain(args []string, stderr io.Writer) int {
	lf := &logFlags{}
	return runMainWith(newRootLogs(lf), lf, args, stderr)
}

func runMainWith(root *cobra.Command, lf *logFlags, args []string, stderr io.Writer) (code int) {
	root.SetArgs(args)
	json := formatArg(args) == "json"
	var fatal *slog.Logger
	if json {
		fatal = slog.New(logs.NewLimiter(logs.Options{}).Wrap(slog.NewJSONHandler(stderr, nil)))
		root.SetErr(stdLog{fatal})
		setFlagOutput(root, stdLog{fatal})
		// client-go's klog writes text to stderr until a command that
		// logs sets its logger (useSlog): JSON from the start.
		klog.SetLogger(logr.FromSlogHandler(fatal.Handler()))
	}
	defer func() {
		if lf.limiter != nil {
			lf.limiter.Flush()
		}
		p := recover()
		if p == nil {
			return
		}
		code = 2
		if !json {
			fmt.Fprintf(stderr, "panic: %v\n\n%s", p, debug.Stack())
			return
		}
		fatal.Error(fmt.Sprint("panic: ", p), "stack", strings.Split(strings.TrimSpace(string(debug.Stack())), "\n"), "exit_code", code)
	}()
	if err := root.Execute(); err != nil {
		if !json {
			fmt.Fprintln(stderr, "hoplink:", err)
			return 1
		}
		fatal.Error("hoplink: "+err.Error(), "exit_code", 1)
		return 1
	}
	return 0
}

// setFlagOutput sends what pflag prints itself (a deprecated flag's
// warning) to w, for c and its subcommands.
func setFlagOutput(c *cobra.Command, w io.Writer) {
	c.Flags().SetOutput(w)
	c.PersistentFlags().SetOutput(w)
	for _, sub := range c.Commands() {
		setFlagOutput(sub, w)
	}
}

// formatArg is the value of --log-format in args, read before cobra parses
// them: an error in parsing them is to come out in that format too.
func formatArg(args []string) string {
	format := "text"
	for i, a := range args {
		switch {
		case a == "--":
			return format
		case a == "--log-format" && i+1 < len(args):
			format = args[i+1]
		case strings.HasPrefix(a, "--log-format="):
			format = strings.TrimPrefix(a, "--log-format=")
		}
	}
	return strings.ToLower(format)
}

type logFlags struct {
	level  string
	format string

	limiter *logs.Limiter // of the logger last made, to flush at exit
	stderr  *watchedOutput
}

// outputGone is closed when a log line finds no reader on stderr.
func (f *logFlags) outputGone() <-chan struct{} {
	if f.stderr == nil {
		return nil
	}
	return f.stderr.gone
}

// watchedOutput is a writer that says when its reader went away (EPIPE):
// 'hoplink local | tee' whose tee died to Ctrl-C. Then the process is to
// shut down as on a signal, cleaning up, rather than log into nothing.
type watchedOutput struct {
	w    io.Writer
	once sync.Once
	gone chan struct{}
}

func (o *watchedOutput) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if errors.Is(err, syscall.EPIPE) {
		o.once.Do(func() { close(o.gone) })
	}
	return n, err
}

func (f *logFlags) logger() (*slog.Logger, error) {
	f.stderr = &watchedOutput{w: os.Stderr, gone: make(chan struct{})}
	l, err := f.loggerTo(f.stderr)
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
	w.l.Warn(strings.TrimSpace(string(p)), "origin", "log")
	return len(p), nil
}

// check refuses log flags no logger can be made of. Every command runs it
// (the root's PersistentPreRunE), also those that log nothing, so a typo
// is not taken silently by one command and refused by the next.
func (f *logFlags) check() (slog.Level, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.level)); err != nil {
		return lvl, fmt.Errorf("--log-level %q: use debug, info, warn or error", f.level)
	}
	switch strings.ToLower(f.format) {
	case "text", "json":
		return lvl, nil
	}
	return lvl, fmt.Errorf("--log-format %q: use text or json", f.format)
}

func (f *logFlags) loggerTo(out io.Writer) (*slog.Logger, error) {
	lvl, err := f.check()
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(out, opts)
	if strings.ToLower(f.format) == "json" {
		h = slog.NewJSONHandler(out, opts)
	}
	// A condition that repeats (a peer down, flows with no route) is a line
	// and then one per window with a count; no line holds a line break.
	f.limiter = logs.NewLimiter(logs.Options{})
	return slog.New(f.limiter.Wrap(h)), nil
}

func newRoot() *cobra.Command { return newRootLogs(&logFlags{}) }

func newRootLogs(lf *logFlags) *cobra.Command {
	root := &cobra.Command{
		Use:           "hoplink",
		Short:         "Carry TCP, UDP and IP subnets across multi-hop chains of relays",
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version, as well as the version command: what most tools take.
		Version: version,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			_, err := lf.check()
			return err
		},
	}
	root.SetVersionTemplate(versionLine())
	root.PersistentFlags().StringVar(&lf.level, "log-level", "info", "the least `LEVEL` logged: debug, info, warn or error")
	root.PersistentFlags().StringVar(&lf.format, "log-format", "text", "the logs' `FORMAT`: text or json")
	root.AddCommand(newLocalCmd(lf), newForwardCmd(lf), newRelayCmd(lf), newOperatorCmd(lf), newCertCmd(), newStatusCmd(), newProbeCmd(), newVersionCmd())
	addCompletions(root)
	return root
}
