package controllers

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// operatorWrites counts the operator's write requests by resource and verb:
// client-go's rest_client_requests_total has the method but not the
// resource, and "which kind costs the writes" is the question at scale.
var operatorWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "hoplink_operator_api_writes_total",
	Help: "Write requests the operator sent to the API server, by resource (with subresource) and verb.",
}, []string{"resource", "verb"})

func init() { ctrlmetrics.Registry.MustRegister(operatorWrites) }

// countWrites wraps a REST transport so that every write is counted in
// operatorWrites before it is sent.
func countWrites(rt http.RoundTripper) http.RoundTripper {
	return countingTransport(func(r *http.Request) (*http.Response, error) {
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			operatorWrites.WithLabelValues(resourceOf(r.URL.Path), r.Method).Inc()
		}
		return rt.RoundTrip(r)
	})
}

type countingTransport func(*http.Request) (*http.Response, error)

func (f countingTransport) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf names a request path's resource, "services" or
// "chains/status": /api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUB]] and
// /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME[/SUB]].
func resourceOf(path string) string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(p) > 2 && p[0] == "api":
		p = p[2:]
	case len(p) > 3 && p[0] == "apis":
		p = p[3:]
	default:
		return "other"
	}
	if len(p) > 2 && p[0] == "namespaces" {
		p = p[2:]
	}
	switch len(p) {
	case 0:
		return "other"
	case 1, 2:
		return p[0]
	default:
		return p[0] + "/" + p[2]
	}
}
