package main

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// timeMetric is a metric whose figure is a duration: round trips, jitter,
// latencies, setup and connect times.
var timeMetric = regexp.MustCompile(`\bhoplink_[a-z_]*(rtt|jitter|latency|setup)[a-z_]*seconds`)

// One kind of figure, one unit: every panel that shows a duration says it
// is in seconds wherever a unit is set (field defaults, overrides of a
// field a duration lands in, the heatmap's axis), so that no panel reads
// seconds beside another in ms.
func TestDurationsShareAUnit(t *testing.T) {
	b, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
				Overrides []struct {
					Matcher struct {
						Options string `json:"options"`
					} `json:"matcher"`
					Properties []struct {
						ID    string `json:"id"`
						Value any    `json:"value"`
					} `json:"properties"`
				} `json:"overrides"`
			} `json:"fieldConfig"`
			Options struct {
				YAxis *struct {
					Unit string `json:"unit"`
				} `json:"yAxis"`
			} `json:"options"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range d.Panels {
		times := false
		for _, tg := range p.Targets {
			times = times || timeMetric.MatchString(tg.Expr)
		}
		if !times {
			continue
		}
		n++
		u := p.FieldConfig.Defaults.Unit
		if p.Type == "nodegraph" {
			// The round trip is an edge's mainstat (TestNetworkMap).
			for _, o := range p.FieldConfig.Overrides {
				for _, pr := range o.Properties {
					if o.Matcher.Options == "mainstat" && pr.ID == "unit" {
						u, _ = pr.Value.(string)
					}
				}
			}
		}
		if u != "s" {
			t.Errorf("panel %q shows durations in unit %q, want s", p.Title, u)
		}
		if p.Options.YAxis != nil && p.Options.YAxis.Unit != "s" {
			t.Errorf("panel %q: its axis is in %q, want s", p.Title, p.Options.YAxis.Unit)
		}
	}
	if n < 5 {
		t.Errorf("only %d panels show durations", n)
	}
}
