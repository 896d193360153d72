package inject

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSourceLimitHoldsOneSourceOnly: a source over its allowance waits,
// then is refused with 429, while another source's reviews go straight
// through; an IPv6 source counts by its /64.
func TestSourceLimitHoldsOneSourceOnly(t *testing.T) {
	var served atomic.Int64
	s := &SourceLimit{Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }),
		Rate: 1, Burst: 5, Hold: 50 * time.Millisecond}
	call := func(remote string) int {
		r := httptest.NewRequest(http.MethodPost, Path, nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code
	}
	codes := map[int]int{}
	for i := range 20 {
		// Addresses of one IPv6 /64: one source.
		codes[call(fmt.Sprintf("[2001:db8::%x]:443", i+1))]++
	}
	if codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 15 {
		t.Errorf("one /64, 20 reviews at once: %v; want 5 answered and 15 refused", codes)
	}
	for i := range 5 {
		if c := call(fmt.Sprintf("10.0.0.1:%d", 1000+i)); c != http.StatusOK {
			t.Errorf("another source's review %d: %d", i, c)
		}
	}
	if c := call("[2001:db8:0:1::1]:443"); c != http.StatusOK {
		t.Errorf("the next /64: %d", c)
	}
	if served.Load() != 11 {
		t.Errorf("served %d, want 11", served.Load())
	}
}

// TestSourceLimitWaitsWithinHold: a review that can have its turn within
// Hold waits for it and is served.
func TestSourceLimitWaitsWithinHold(t *testing.T) {
	s := &SourceLimit{Next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), Rate: 20, Burst: 1, Hold: time.Second}
	var wg sync.WaitGroup
	codes := make([]int, 5)
	start := time.Now()
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest(http.MethodPost, Path, nil)
			r.RemoteAddr = "192.0.2.1:1"
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			codes[i] = w.Code
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("review %d: %d", i, c)
		}
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("5 reviews at 20 a second with a burst of 1 took %v: not paced", d)
	}
}

// TestSourceTableIsBounded: past maxSources, new sources share one
// allowance and the table grows no more.
func TestSourceTableIsBounded(t *testing.T) {
	s := NewSourceLimit(nil)
	now := time.Now()
	for i := range maxSources + 100 {
		s.limiter(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32), now)
	}
	if n := len(s.sources); n > maxSources+1 {
		t.Errorf("%d sources kept, bound %d", n, maxSources)
	}
	// A minute later the quiet ones go.
	s.limiter(netip.MustParsePrefix("192.0.2.1/32"), now.Add(2*sourceIdle))
	if n := len(s.sources); n != 1 {
		t.Errorf("%d sources after a quiet minute, want 1", n)
	}
}

func TestCallerOf(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3:443":          "10.1.2.3/32",
		"[::ffff:10.1.2.3]:443": "10.1.2.3/32",
		"[fe80::1%eth0]:443":    "fe80::/64",
		"[2001:db8:1:2:3::4]:1": "2001:db8:1:2::/64",
		"not an address":        "invalid Prefix",
	} {
		if got := callerOf(in).String(); got != want {
			t.Errorf("callerOf(%q) = %s, want %s", in, got, want)
		}
	}
}
