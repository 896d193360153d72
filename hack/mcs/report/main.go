// Command report summarizes the report.yaml that the MCS API conformance
// suite writes: counts, then every spec with its verdict, the way the suite's
// own report.html words it (a spec that failed on an assertion of the spec is
// not conformant; one that failed on anything else has no verdict). It exits
// 1 when a spec or the suite's set-up failed.
//
//	go run ./hack/mcs/report bin/mcs/report.yaml
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// The suite encodes its report data with gopkg.in/yaml.v3 and no tags, so its
// keys are the lower-cased Go field names; encoding/json (behind
// sigs.k8s.io/yaml) matches them to these fields case-insensitively.
type report struct {
	Groups         []group
	SuiteFailure   string
	DNSDomain      string
	Passed         int
	Total          int
	Implementation struct{ Organization, Project, Version, URL string }
}

type group struct {
	Name  string // Required or Optional
	Tests []test
}

type test struct {
	Desc       string
	Ref        string
	Labels     []string
	Passed     bool
	Failed     bool // failed without a verdict on conformance
	Skipped    bool
	Conformant bool
	Message    string // " - why", when there is one
}

func (t test) verdict() string {
	switch {
	case t.Skipped:
		return "SKIPPED"
	case t.Failed:
		return "UNKNOWN"
	case !t.Conformant:
		return "FAILED"
	default:
		return "PASSED"
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: report REPORT.yaml")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var r report
	if err := yaml.Unmarshal(data, &r); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(2)
	}
	if !summarize(os.Stdout, r) {
		os.Exit(1)
	}
}

// summarize prints r and says whether every spec that ran passed.
func summarize(w io.Writer, r report) bool {
	counts := map[string]int{}
	for _, g := range r.Groups {
		for _, t := range g.Tests {
			counts[t.verdict()]++
		}
	}
	impl := strings.TrimSpace(r.Implementation.Project + " " + r.Implementation.Version)
	fmt.Fprintf(w, "MCS API conformance (%s): %d of %d passed, %d failed (not conformant), %d unknown (failed without a verdict), %d skipped\n",
		impl, counts["PASSED"], r.Total, counts["FAILED"], counts["UNKNOWN"], counts["SKIPPED"])
	if r.DNSDomain != "" && r.DNSDomain != "clusterset.local" {
		fmt.Fprintf(w, "DNS domain: %s\n", r.DNSDomain)
	}
	ok := counts["FAILED"] == 0 && counts["UNKNOWN"] == 0
	if r.SuiteFailure != "" {
		fmt.Fprintf(w, "SUITE SET-UP FAILED: %s\n", r.SuiteFailure)
		ok = false
	}
	for _, g := range r.Groups {
		fmt.Fprintf(w, "%s:\n", g.Name)
		for _, t := range g.Tests {
			labels := ""
			if len(t.Labels) > 0 {
				labels = " [" + strings.Join(t.Labels, ", ") + "]"
			}
			fmt.Fprintf(w, "  %-8s %s%s%s\n", t.verdict(), t.Desc, labels, t.Message)
		}
	}
	return ok
}
