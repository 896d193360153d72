package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hoplink/hoplink/measure"
)

// Backend is what a relay answers with. It admits each call itself (the
// client, the chain, this relay's part in it) and refuses with an *Error.
type Backend interface {
	// Links measures this relay's table for chain, reusing measurements
	// younger than fresh; fresh < 0 asks for the chain's default.
	Links(ctx context.Context, client, chain string, fresh time.Duration) (*measure.Table, error)
	// Trace measures routes of chain end to end, from this relay, its entry.
	Trace(ctx context.Context, client, chain string, routes [][]string) ([]measure.Trace, error)
	// Status reports the relay's entries and problems.
	Status(ctx context.Context, client string) (*Status, error)
	// ClusterSet returns the relay's Board, once its version is not after
	// or wait has passed.
	ClusterSet(ctx context.Context, client, after string, wait time.Duration) (data []byte, version string, err error)
}

// Handler serves the admin API from b.
func Handler(b Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathLinks, func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		fresh := time.Duration(-1)
		if f := q.Get("fresh"); f != "" {
			d, err := time.ParseDuration(f)
			if err != nil || d < 0 {
				answer(w, nil, BadRequest("bad_fresh", fmt.Errorf("fresh=%q: want a duration like 500ms", f)))
				return
			}
			fresh = d
		}
		t, err := b.Links(req.Context(), ClientOf(req.Context()), q.Get("chain"), fresh)
		answer(w, t, err)
	})
	mux.HandleFunc("POST "+PathTrace, func(w http.ResponseWriter, req *http.Request) {
		var body TraceRequest
		err := json.NewDecoder(http.MaxBytesReader(w, req.Body, MaxRequestBody)).Decode(&body)
		if err != nil || len(body.Routes) == 0 || len(body.Routes) > MaxTraceRoutes {
			answer(w, nil, BadRequest("bad_body", fmt.Errorf(`want {"routes": [[relay, ...], ...]} with 1-%d routes (%v)`, MaxTraceRoutes, err)))
			return
		}
		res, err := b.Trace(req.Context(), ClientOf(req.Context()), req.URL.Query().Get("chain"), body.Routes)
		answer(w, res, err)
	})
	mux.HandleFunc("GET "+PathStatus, func(w http.ResponseWriter, req *http.Request) {
		s, err := b.Status(req.Context(), ClientOf(req.Context()))
		answer(w, s, err)
	})
	mux.HandleFunc("GET "+PathClusterSet, func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		wait := time.Duration(0)
		if s := q.Get("wait"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 || d > MaxWait {
				answer(w, nil, BadRequest("bad_wait", fmt.Errorf("wait=%q: want a duration up to %s", s, MaxWait)))
				return
			}
			wait = d
		}
		after := q.Get("after")
		data, version, err := b.ClusterSet(req.Context(), ClientOf(req.Context()), after, wait)
		if err != nil {
			answer(w, nil, err)
			return
		}
		switch {
		case version == "":
			answer(w, nil, NotFound("no_report", errors.New("this relay's cluster publishes no clusterset report (is the operator's multicluster mode on?)")))
		case version == after:
			w.Header().Set(VersionHeader, version)
			w.WriteHeader(http.StatusNotModified)
		default:
			w.Header().Set(VersionHeader, version)
			w.Header().Set("Content-Type", "application/gzip")
			w.Write(data)
		}
	})
	return mux
}

func answer(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Status: http.StatusInternalServerError, Reason: "internal", Msg: err.Error()}
		}
		w.WriteHeader(e.Status)
		v = e
	}
	json.NewEncoder(w).Encode(v)
}
