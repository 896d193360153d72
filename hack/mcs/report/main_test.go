package main

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// A report as the suite's yaml.v3 encoder writes it (lower-cased keys), with
// one spec of each verdict.
const sample = `groups:
    - name: Required
      tests:
        - desc: Connectivity to a service that is not exported should be inaccessible
          ref: ""
          labels: []
          passed: true
          failed: false
          skipped: false
          conformant: true
          message: ""
        - desc: No clusterset IP should be allocated for a Headless ServiceImport
          ref: https://example.invalid/kep#headlessness
          labels:
            - Headless
          passed: false
          failed: false
          skipped: false
          conformant: false
          message: ' - ServiceImport has IPs'
    - name: Optional
      tests:
        - desc: A DNS SRV query should return valid SRV records
          labels: [ClusterIP, DNS]
          passed: false
          failed: true
          skipped: false
          conformant: true
          message: ' - Timed out after 20.000s'
        - desc: Connectivity to exported services should route by port
          labels: [ClusterIP, Connectivity]
          passed: false
          failed: false
          skipped: true
          conformant: true
          message: ' - This test requires at least 2 clusters - skipping'
suitefailure: ""
dnsdomain: clusterset.local
passed: 1
total: 4
implementation:
    organization: hoplink
    project: hoplink
    version: v0.1.0
    url: https://example.invalid/docs
`

func TestSummarize(t *testing.T) {
	var r report
	if err := yaml.Unmarshal([]byte(sample), &r); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if summarize(&b, r) {
		t.Error("a report with a failed and an unknown spec summarized as a pass")
	}
	for _, want := range []string{
		"MCS API conformance (hoplink v0.1.0): 1 of 4 passed, 1 failed (not conformant), 1 unknown (failed without a verdict), 1 skipped\n",
		"  PASSED   Connectivity to a service that is not exported should be inaccessible\n",
		"  FAILED   No clusterset IP should be allocated for a Headless ServiceImport [Headless] - ServiceImport has IPs\n",
		"  UNKNOWN  A DNS SRV query should return valid SRV records [ClusterIP, DNS] - Timed out after 20.000s\n",
		"  SKIPPED  Connectivity to exported services should route by port [ClusterIP, Connectivity] - This test requires",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}

	r.Groups = r.Groups[:1]
	r.Groups[0].Tests = r.Groups[0].Tests[:1]
	if !summarize(&b, r) {
		t.Error("a report whose only spec passed summarized as a failure")
	}
	r.SuiteFailure = "Test suite set up failed"
	if summarize(&b, r) {
		t.Error("a report of a failed set-up summarized as a pass")
	}
}
