package adminapi

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hoplink/hoplink/measure"
)

// counting answers every call and checks what the handler let through.
type counting struct{ t *testing.T }

func (c counting) Links(_ context.Context, _, _ string, fresh time.Duration) (*measure.Table, error) {
	if fresh < -1 {
		c.t.Fatalf("fresh %v reached the backend", fresh)
	}
	return &measure.Table{Relay: "la"}, nil
}

func (c counting) Trace(_ context.Context, _, _ string, routes [][]string) ([]measure.Trace, error) {
	if len(routes) == 0 || len(routes) > MaxTraceRoutes {
		c.t.Fatalf("%d routes reached the backend", len(routes))
	}
	return make([]measure.Trace, len(routes)), nil
}

func (c counting) Status(context.Context, string) (*Status, error) { return &Status{Relay: "la"}, nil }

func (c counting) ClusterSet(_ context.Context, _, after string, wait time.Duration) ([]byte, string, error) {
	if wait < 0 || wait > MaxWait {
		c.t.Fatalf("wait %v reached the backend", wait)
	}
	return []byte("report"), "7", nil
}

// FuzzHandler sends the admin API arbitrary bodies and queries: it answers
// 200, 400, 404 or 405 (never 500, never a panic), and passes the backend
// only what is within its limits.
func FuzzHandler(f *testing.F) {
	f.Add([]byte(`{"routes": [["hk", "la"]]}`), "chain=default/c&fresh=500ms")
	f.Add([]byte(`{"routes": []}`), "fresh=-1s")
	f.Add(bytes.Repeat([]byte("["), 20000), "fresh=1e9999h")
	f.Add([]byte{}, "after=7&wait=31s")
	f.Fuzz(func(t *testing.T, body []byte, query string) {
		h := Handler(counting{t})
		post := httptest.NewRequest(http.MethodPost, PathTrace, bytes.NewReader(body))
		get := httptest.NewRequest(http.MethodGet, PathLinks, nil)
		report := httptest.NewRequest(http.MethodGet, PathClusterSet, nil)
		for _, req := range []*http.Request{post, get, report} {
			req.URL.RawQuery = query // whatever a client sends: parsed leniently
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			switch w.Code {
			case http.StatusOK, http.StatusNotModified, http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed:
			default:
				t.Fatalf("%s %s: %d %s", req.Method, req.URL, w.Code, w.Body)
			}
		}
	})
}
