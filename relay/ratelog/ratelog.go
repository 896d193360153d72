// Package ratelog bounds what peers and clients can make a relay log. A
// refused stream or handshake is worth a line, but 60,000 of them from one
// peer are a denial of service on the relay's log and CPU: each message
// gets a few lines at once and then one a second, and the line that ends a
// quiet spell says how many were left out. Counting is the metrics' job.
package ratelog

import (
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults: a burst of this many lines per message, then one per Every.
const (
	Burst = 5
	Every = time.Second
)

// Logger writes warnings through log, at most Burst at once and one per
// Every after that, for each message.
type Logger struct {
	log *slog.Logger

	mu   sync.Mutex
	msgs map[string]*limit
}

type limit struct {
	lim        *rate.Limiter
	suppressed int
}

// New makes a Logger over log.
func New(log *slog.Logger) *Logger {
	return &Logger{log: log, msgs: map[string]*limit{}}
}

// Warn logs msg with args, unless msg was logged too often lately.
func (l *Logger) Warn(msg string, args ...any) {
	l.mu.Lock()
	m := l.msgs[msg]
	if m == nil {
		m = &limit{lim: rate.NewLimiter(rate.Every(Every), Burst)}
		l.msgs[msg] = m // messages are constants of the code: the map stays small
	}
	if !m.lim.Allow() {
		m.suppressed++
		l.mu.Unlock()
		return
	}
	if m.suppressed > 0 {
		args = append(args, "suppressed", m.suppressed)
		m.suppressed = 0
	}
	l.mu.Unlock()
	l.log.Warn(msg, args...)
}
