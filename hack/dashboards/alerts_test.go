package main

import (
	"os"
	"regexp"
	"testing"
)

const alertsTemplate = "../../charts/hoplink/templates/alerts.yaml"

// onCall are metrics an on-call engineer looks for that no alert names:
// sessions beside drops, peers' streams refused, targets down.
var onCall = []string{"hoplink_udp_sessions", "hoplink_rejected_streams_total", "hoplink_target_up"}

// An alert that fires needs a panel that shows what it fired on: every
// metric the chart's alerts use is in some panel's query, and so is each of
// onCall.
func TestEveryAlertHasAPanel(t *testing.T) {
	rules, err := os.ReadFile(alertsTemplate)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*expr:.*$`).FindAllString(string(rules), -1) {
		for _, n := range regexp.MustCompile(`\bhoplink_[a-z_]+`).FindAllString(m, -1) {
			want[n] = true
		}
	}
	if len(want) < 5 {
		t.Fatalf("only %d metrics in the alerts of %s", len(want), alertsTemplate)
	}
	for _, n := range onCall {
		want[n] = true
	}
	b, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for name, expr := range queries(t, b) {
		if name[:5] != "panel" {
			continue // an annotation is no panel
		}
		for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
			shown[m[1]] = true
		}
	}
	for n := range want {
		if !shown[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}
