// Command dashboards writes the hoplink Grafana dashboard from the panels
// below, so that the dashboard is code: reviewed in diffs, and every query in
// it checked against a real Prometheus scraping real relays
// (TestDashboardQueriesReturnData).
//
//	go run ./hack/dashboards            # writes charts/hoplink/dashboards/hoplink.json
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

func main() {
	out := flag.String("o", "charts/hoplink/dashboards/hoplink.json", "where to write the dashboard")
	flag.Parse()
	b, err := Render()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Render returns the dashboard's JSON.
func Render() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(dashboard()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
