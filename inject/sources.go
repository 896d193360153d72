package inject

import (
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/srcaddr"
)

// SourceLimit holds each caller address of the webhook to a rate of
// reviews, so that a pod posting reviews as fast as it can (the port takes
// anyone's unless a client CA is given) spends little of the operator's
// CPU and never the API server's share: the API server calls from
// addresses of its own, each with its own allowance. An IPv6 caller counts
// by its /64.
//
// A review over its source's rate waits for its turn up to Hold, then is
// answered 429: a client that loops on refusals still makes at most one
// request per Hold per connection.
type SourceLimit struct {
	Next  http.Handler
	Rate  rate.Limit    // reviews a second per source
	Burst int           // reviews a source may send at once
	Hold  time.Duration // longest wait for a turn

	mu      sync.Mutex
	sources map[netip.Prefix]*source
	swept   time.Time
}

type source struct {
	lim  *rate.Limiter
	seen time.Time
}

// Defaults: an API server admitting a Deployment's scale-up of sidecar pods
// sends a few reviews a second; a burst of 200 and 100 a second cover
// thousands of pods a minute.
const (
	DefaultSourceRate  = 100
	DefaultSourceBurst = 200
	DefaultSourceHold  = time.Second
	// maxSources bounds the table; past it, sources share one allowance
	// (a flood from many addresses then holds only itself back, once the
	// table has room again a minute after they go quiet).
	maxSources = 4096
	sourceIdle = time.Minute
)

// NewSourceLimit wraps next with the default allowance per source.
func NewSourceLimit(next http.Handler) *SourceLimit {
	return &SourceLimit{Next: next, Rate: DefaultSourceRate, Burst: DefaultSourceBurst, Hold: DefaultSourceHold}
}

func (s *SourceLimit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lim := s.limiter(callerOf(r.RemoteAddr), time.Now())
	res := lim.Reserve()
	if d := res.Delay(); d > s.Hold {
		res.Cancel()
		s.wait(r, s.Hold)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many admission reviews from this address: wait and try again", http.StatusTooManyRequests)
		return
	} else if d > 0 && !s.wait(r, d) {
		res.Cancel()
		return
	}
	s.Next.ServeHTTP(w, r)
}

// wait sleeps d or until the caller goes; false if it went.
func (s *SourceLimit) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// limiter is key's allowance, made on first use.
func (s *SourceLimit) limiter(key netip.Prefix, now time.Time) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sources == nil {
		s.sources = map[netip.Prefix]*source{}
	}
	if now.Sub(s.swept) > sourceIdle {
		s.swept = now
		for k, src := range s.sources {
			if now.Sub(src.seen) > sourceIdle {
				delete(s.sources, k)
			}
		}
	}
	src := s.sources[key]
	if src == nil {
		if len(s.sources) >= maxSources {
			key = netip.Prefix{} // the shared allowance of sources past the table's bound
			src = s.sources[key]
		}
		if src == nil {
			src = &source{lim: rate.NewLimiter(s.Rate, s.Burst)}
			s.sources[key] = src
		}
	}
	src.seen = now
	return src.lim
}

// callerOf is the source an http.Request's RemoteAddr counts under (the
// zero Prefix when it is not an address).
func callerOf(remote string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Prefix{}
	}
	return srcaddr.Key(ap.Addr())
}
