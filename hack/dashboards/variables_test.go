package main

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/metrics"
)

// recorder is a Registerer that keeps what relays register.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

// metricLabels is the labels of every metric a relay exports, by name.
func metricLabels(t *testing.T) map[string][]string {
	var r recorder
	metrics.New(&r)
	ch := make(chan *prometheus.Desc, 1000)
	for _, c := range r.cs {
		c.Describe(ch)
	}
	close(ch)
	re := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var ls []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				ls = append(ls, l)
			}
		}
		out[m[1]] = ls
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics registered", len(out))
	}
	return out
}

// selectorRE is a metric name in a query and the label matchers after it.
var selectorRE = regexp.MustCompile(`\b((?:hoplink|process)_[a-z0-9_]+)(\{[^}]*\})?`)

// Every query of the dashboard narrows each label its metrics have that a
// variable stands for (relay, or from for links; chain; tunnel) by that
// variable, so that picking a relay, chain or tunnel narrows every panel;
// and every variable is used.
func TestQueriesUseTheVariables(t *testing.T) {
	labels := metricLabels(t)
	b, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	qs := queries(t, b)
	var names []string
	for name := range qs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		expr := qs[name]
		ms := selectorRE.FindAllStringSubmatch(expr, -1)
		if len(ms) == 0 {
			t.Errorf("%s: no metric in %s", name, expr)
		}
		for _, m := range ms {
			metric, matchers := m[1], m[2]
			if strings.HasPrefix(metric, "process_") {
				continue // no labels of its own: joined to hoplink_relay_ready
			}
			ls, ok := labels[strings.TrimSuffix(metric, "_bucket")]
			if !ok {
				t.Errorf("%s: %s is no metric relays export", name, metric)
				continue
			}
			for _, l := range ls {
				v, ok := varOfLabel[l]
				if !ok {
					continue
				}
				want := l + `=~"$` + v + `"`
				if !strings.Contains(matchers, want) {
					t.Errorf("%s: %s has label %s but the query does not narrow it by $%s (want %s): %s", name, metric, l, v, want, expr)
				}
				used[v] = true
			}
		}
	}
	for _, v := range templateVars {
		for _, other := range templateVars {
			if strings.Contains(other.query, "$"+v.name) {
				used[v.name] = true
			}
		}
		if !used[v.name] {
			t.Errorf("variable $%s narrows no query", v.name)
		}
	}
}
