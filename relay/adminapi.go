package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/hoplink/hoplink/routectl"
)

// The admin API is how the operator's route controller measures: HTTP on
// the relay's TLS port, for a client that negotiates pki.AdminALPN with the
// operator's certificate (tlslink turns anyone else away).
//
//	GET  /v1/links?chain=NS/NAME&fresh=DURATION   this relay's probe.Table for the chain
//	POST /v1/pipe?chain=NS/NAME  {"routes": [[...]]}   end-to-end probes from the entry
const (
	// maxPipeRoutes bounds the routes one pipe request may probe: the most
	// candidates a chain may ask for, and its current route.
	maxPipeRoutes = 9
	maxAdminBody  = 16 << 10
)

// PipeRequest is the body of POST /v1/pipe.
type PipeRequest struct {
	Routes [][]string `json:"routes"`
}

func (r *Relay) adminAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/links", func(w http.ResponseWriter, req *http.Request) {
		c, reason, err := r.routedChain(req.URL.Query().Get("chain"))
		if err == nil && !slices.Contains(routectl.Asked(c), r.cfg.Name) {
			reason, err = "not_member", fmt.Errorf("relay %q is not on Chain %q", r.cfg.Name, req.URL.Query().Get("chain"))
		}
		if err != nil {
			adminError(w, http.StatusNotFound, reason, err)
			return
		}
		interval := routectl.Interval(c)
		fresh := interval / 4
		if f := req.URL.Query().Get("fresh"); f != "" {
			if fresh, err = time.ParseDuration(f); err != nil || fresh < 0 {
				adminError(w, http.StatusBadRequest, "bad_fresh", fmt.Errorf("fresh=%q: want a duration like 500ms", f))
				return
			}
		}
		ctx, cancel := context.WithTimeout(req.Context(), routectl.ProbeWait(interval))
		defer cancel()
		adminJSON(w, r.LinkTable(ctx, c, min(fresh, interval)))
	})
	mux.HandleFunc("POST /v1/pipe", func(w http.ResponseWriter, req *http.Request) {
		key := req.URL.Query().Get("chain")
		c, reason, err := r.routedChain(key)
		if err == nil && c.Spec.Entry != r.cfg.Name {
			reason, err = "not_entry", fmt.Errorf("relay %q is not the entry of Chain %q; ask %q", r.cfg.Name, key, c.Spec.Entry)
		}
		if err != nil {
			adminError(w, http.StatusNotFound, reason, err)
			return
		}
		var body PipeRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxAdminBody)).Decode(&body); err != nil || len(body.Routes) == 0 || len(body.Routes) > maxPipeRoutes {
			adminError(w, http.StatusBadRequest, "bad_body", fmt.Errorf(`want {"routes": [[relay, ...], ...]} with 1-%d routes (%v)`, maxPipeRoutes, err))
			return
		}
		ctx, cancel := context.WithTimeout(req.Context(), routectl.Interval(c))
		defer cancel()
		adminJSON(w, r.PipeProbe(ctx, c, body.Routes))
	})
	return mux
}

func adminJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func adminError(w http.ResponseWriter, status int, reason string, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"reason": reason, "error": err.Error()})
}
