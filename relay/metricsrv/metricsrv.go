// Package metricsrv serves a relay process's operational HTTP endpoints:
// Prometheus metrics, liveness and readiness.
package metricsrv

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is a running admin endpoint.
type Server struct {
	srv *http.Server
	ln  *connTable
}

// Anyone who reaches the port may connect (kubelet probes and Prometheus
// carry no credentials), so what a connection may cost is bounded: time to
// send its request, to read the answer, to sit idle between requests, the
// size of its headers, and how many are open at once. A probe or scrape
// needs a few hundred bytes and milliseconds of each.
const (
	// MaxConns bounds open connections; past it the idlest of the source
	// holding the most is closed (connTable). At about 20 KiB each, the
	// table costs at most 5 MiB.
	MaxConns          = 256
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	// idleTimeout closes keep-alive connections between requests; scrapes
	// come every 10 s or more, so a scraper just connects again.
	idleTimeout    = 5 * time.Second
	maxHeaderBytes = 8 << 10
	// profileTimeout is the write deadline of /debug/pprof, whose profile
	// and trace take as long as asked (30 s by default).
	profileTimeout = 5 * time.Minute
)

// Serve starts /metrics, /healthz and /readyz on addr. ready reports
// whether the process should receive traffic.
func Serve(addr string, g prometheus.Gatherer, ready func() bool, profiling bool, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return serve(ln, defaultLimits, g, ready, profiling, log), nil
}

// limits are a server's bounds (defaultLimits; tests take less).
type limits struct {
	conns                                  int
	readHeader, read, write, idle, profile time.Duration
}

var defaultLimits = limits{conns: MaxConns, readHeader: readHeaderTimeout, read: readTimeout, write: writeTimeout, idle: idleTimeout, profile: profileTimeout}

func serve(l net.Listener, lim limits, g prometheus.Gatherer, ready func() bool, profiling bool, log *slog.Logger) *Server {
	ln := newConnTable(l, lim.conns)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready\n", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	if profiling {
		mux.Handle("/debug/pprof/", writeWithin(lim.profile, http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", writeWithin(lim.profile, http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/trace", writeWithin(lim.profile, http.HandlerFunc(pprof.Trace)))
	}
	s := &Server{srv: &http.Server{
		Handler: writeWithin(lim.write, mux), ConnState: ln.track,
		ReadHeaderTimeout: lim.readHeader, ReadTimeout: lim.read, IdleTimeout: lim.idle, MaxHeaderBytes: maxHeaderBytes,
	}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return s
}

// writeWithin bounds the time to write an answer, a client that does not
// read it included. It stands for http.Server.WriteTimeout, which pprof
// would take as the longest profile it may run; the innermost call wins,
// so the profiles' handlers get their own.
func writeWithin(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
