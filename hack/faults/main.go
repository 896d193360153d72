// Command faults kills each relay of a three-relay chain (hk -> m -> la,
// each its own process) in the middle of a paced transfer, over QUIC and
// over TLS, uploading and downloading, and prints how the client and the
// target saw the flow end: a markdown table of the twelve cases with a
// verdict each. A relay's crash must cost both ends an error within 10 s;
// TRUNCATED is a clean end of stream short of what was sent.
//
//	CGO_ENABLED=0 go build -o bin/hoplink ./cmd/hoplink && go run ./hack/faults -bin bin/hoplink
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/faults"
)

func main() {
	bin := flag.String("bin", "bin/hoplink", "the hoplink binary")
	mib := flag.Int64("mib", 16, "MiB each transfer sends")
	pace := flag.Duration("pace", 8*time.Second, "how long each transfer is spread over")
	kill := flag.Duration("kill", 2*time.Second, "when the relay is killed, from the transfer's first byte")
	wait := flag.Duration("wait", 15*time.Second, "how long after the kill an end may take before it counts as none")
	transport := flag.String("transport", "", "quic or tls alone (default both)")
	role := flag.String("role", "", "entry, middle or exit alone (default each)")
	direction := flag.String("direction", "", "upload or download alone (default both)")
	parallel := flag.Int("parallel", 1, "cases at once (more make the timings noisier)")
	dir := flag.String("dir", "", "where the relays' files and logs go, kept (default a temporary directory, removed at the end)")
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var cases []faults.Case
	for _, c := range faults.Cases(faults.Case{Size: *mib << 20, Pace: *pace, KillAfter: *kill, Wait: *wait}) {
		if (*transport == "" || *transport == c.Transport) && (*role == "" || *role == c.Role) &&
			(*direction == "" || *direction == c.Direction) {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		fail(fmt.Errorf("no case is %q %q %q", *transport, *role, *direction))
	}
	temp := *dir == ""
	if temp {
		d, err := os.MkdirTemp("", "hoplink-faults-")
		if err != nil {
			fail(err)
		}
		*dir = d
	}

	results := make([]faults.Result, len(cases))
	errs := make([]error, len(cases))
	sem := make(chan struct{}, max(1, *parallel))
	var wg sync.WaitGroup
	for i, c := range cases {
		sem <- struct{}{} // in order, as many at once as asked
		wg.Go(func() {
			defer func() { <-sem }()
			results[i], errs[i] = faults.Run(ctx, *bin, *dir, c)
			if errs[i] == nil {
				fmt.Fprintln(os.Stderr, results[i].Detail())
			}
		})
	}
	wg.Wait()
	var measured []faults.Result
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: not measured: %v\n", cases[i], err)
			continue
		}
		measured = append(measured, results[i])
	}
	fmt.Printf("%d MiB over %v, the relay killed %v in; an end waited for at most %v after the kill.\n\n",
		*mib, *pace, *kill, *wait)
	fmt.Print(faults.Table(measured))
	if temp {
		os.RemoveAll(*dir)
	}
	if len(measured) < len(cases) || slices.ContainsFunc(measured, func(r faults.Result) bool { return r.Verdict() != faults.OK }) {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "faults:", err)
	os.Exit(2)
}
