package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The help text of a reason-labelled metric names every reason the relays
// count it under, at least every reason written as a literal where it is
// counted: a new limit's reason is usually one (header_limit, links_limit
// went unlisted).
func TestHelpNamesEveryCountedReason(t *testing.T) {
	m := New(prometheus.NewRegistry())
	help := func(c prometheus.Collector) string {
		ch := make(chan *prometheus.Desc, 1)
		c.Describe(ch)
		return (<-ch).String()
	}
	// The calls that count each metric, with the reason a literal.
	counted := []struct {
		metric string
		help   string
		call   *regexp.Regexp
	}{
		{"hoplink_rejected_streams_total", help(m.Rejected), regexp.MustCompile(`(?:\.rejected\(|\bRejected\.WithLabelValues\()[^\n]*?"([a-z_]+)"`)},
		{"hoplink_flow_errors_total", help(m.FlowErrors), regexp.MustCompile(`(?:\.flowError\(|FlowErrors\.WithLabelValues\()[^\n]*?"([a-z_]+)"`)},
		{"hoplink_udp_dropped_packets_total", help(m.UDPDropped), regexp.MustCompile(`(?:\.dropped\(|onDrop\(|UDPDropped\.WithLabelValues\()[^\n]*?"([a-z_]+)"`)},
		{"hoplink_tun_dropped_packets_total", help(m.TUNDropped), regexp.MustCompile(`(?:Stats\.Dropped\(|TUNDropped\.WithLabelValues\()[^\n]*?"([a-z_]+)"`)},
	}
	seen := map[string]int{}
	err := filepath.WalkDir("../relay", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, c := range counted {
			for _, mt := range c.call.FindAllStringSubmatch(string(src), -1) {
				seen[c.metric]++
				if !regexp.MustCompile(`\b` + mt[1] + `\b`).MatchString(c.help) {
					t.Errorf("%s counts %s under reason %q, which its help text does not name: %s", path, c.metric, mt[1], c.help)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counted {
		if seen[c.metric] == 0 {
			t.Errorf("no call counting %s found: the pattern is stale", c.metric)
		}
	}
}
