// Package logs keeps hoplink's logs readable by someone on call: a warning
// or error that repeats (a peer that cannot be reached, flows with no route)
// is one line, then at most one line per window that says how many were
// left out (info lines are events, each written),
// and no line holds a line break (an error joined from several is one line,
// its parts separated by "; ").
//
// Counting every occurrence is the metrics' job; the log says that it
// happens, when it started, and roughly how often.
package logs

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults for Options.
const (
	DefaultWindow = 10 * time.Second
	DefaultKeys   = 4096
)

// Options tune a Limiter.
type Options struct {
	// Window is the least time between two lines of one condition.
	Window time.Duration
	// Level is the least level limited; nil is slog.LevelWarn. Lines
	// below it are events (a Tunnel opened, manifests reloaded, a peer
	// connected) that each say something new, and conditions do not
	// repeat there; they are flattened all the same.
	Level slog.Leveler
	// Keys bounds how many conditions are remembered; past it, the one
	// seen first is forgotten (and its pending count written).
	Keys int
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// AfterFunc schedules the line that ends a window (tests); nil is
	// time.AfterFunc.
	AfterFunc func(time.Duration, func()) (stop func() bool)
}

// Attribute keys of a line that stands for several.
const (
	SuppressedKey = "suppressed" // how many lines like it were held back (the line repeats the last)
	WindowKey     = "window"     // over how long, as a Go duration
)

// Limiter is the table of recent conditions, shared by every handler that
// Wrap makes from it. It is safe for concurrent use.
type Limiter struct {
	o Options

	mu    sync.Mutex
	keys  map[string]*list.Element // of *entry
	order *list.List               // oldest first
}

type entry struct {
	key   string
	until time.Time // no line of this condition before then
	n     int       // records since the last line
	last  slog.Record
	h     slog.Handler // the handler last's attributes go through
	stop  func() bool  // the pending flush, if any
}

// NewLimiter makes a Limiter; zero fields of o take the defaults.
func NewLimiter(o Options) *Limiter {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Keys <= 0 {
		o.Keys = DefaultKeys
	}
	if o.Level == nil {
		o.Level = slog.LevelWarn
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.AfterFunc == nil {
		o.AfterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	return &Limiter{o: o, keys: map[string]*list.Element{}, order: list.New()}
}

// Wrap makes h's lines flat and its repeats limited by l.
func (l *Limiter) Wrap(h slog.Handler) slog.Handler {
	return &handler{l: l, next: h}
}

// New is a logger that writes through h, flat and limited with the
// default options.
func New(h slog.Handler) *slog.Logger {
	return slog.New(NewLimiter(Options{}).Wrap(h))
}

// Flush writes the count of every condition left out since its last line,
// as at the end of its window: for a process about to exit.
func (l *Limiter) Flush() {
	l.mu.Lock()
	var out []pending
	for e := l.order.Front(); e != nil; e = e.Next() {
		if p, ok := l.take(e.Value.(*entry)); ok {
			out = append(out, p)
		}
	}
	l.mu.Unlock()
	for _, p := range out {
		p.write()
	}
}

// Len is how many conditions l remembers.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

type pending struct {
	h slog.Handler
	r slog.Record
}

func (p pending) write() { _ = p.h.Handle(context.Background(), p.r) }

// take ends e's window with a line if records were left out; l.mu held.
func (l *Limiter) take(e *entry) (pending, bool) {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
	if e.n == 0 {
		return pending{}, false
	}
	p := pending{h: e.h, r: e.last}
	// Stamped when written, so that lines stay in time order; the line
	// stands for everything up to now.
	p.r.Time = l.o.Now()
	// It stands for every line held back, itself a copy of the last: a
	// reader sees it is not news, however few there were.
	p.r.AddAttrs(slog.Int(SuppressedKey, e.n), slog.String(WindowKey, l.o.Window.String()))
	e.n, e.last, e.h = 0, slog.Record{}, nil
	e.until = l.o.Now().Add(l.o.Window)
	return p, true
}

// allow says whether a record of key goes out now; if not, it is kept as
// the one that ends the window.
func (l *Limiter) allow(key string, r slog.Record, h slog.Handler) bool {
	now := l.o.Now()
	l.mu.Lock()
	el, ok := l.keys[key]
	if !ok {
		var evicted []pending
		for len(l.keys) >= l.o.Keys {
			old := l.order.Front()
			oe := old.Value.(*entry)
			if p, ok := l.take(oe); ok {
				evicted = append(evicted, p)
			}
			l.order.Remove(old)
			delete(l.keys, oe.key)
		}
		l.keys[key] = l.order.PushBack(&entry{key: key, until: now.Add(l.o.Window)})
		l.mu.Unlock()
		for _, p := range evicted {
			p.write()
		}
		return true
	}
	e := el.Value.(*entry)
	if e.n == 0 && !now.Before(e.until) {
		e.until = now.Add(l.o.Window)
		l.mu.Unlock()
		return true
	}
	e.n++
	e.last, e.h = r.Clone(), h
	if e.stop == nil {
		e.stop = l.o.AfterFunc(e.until.Sub(now), func() { l.flush(e) })
	}
	l.mu.Unlock()
	return false
}

func (l *Limiter) flush(e *entry) {
	l.mu.Lock()
	e.stop = nil
	p, ok := l.take(e)
	l.mu.Unlock()
	if ok {
		p.write()
	}
}

// handler is one view (attributes, group) of a Limiter over next.
type handler struct {
	l      *Limiter
	next   slog.Handler
	prefix string // the key of the attributes and groups before the record's
}

func (h *handler) Enabled(ctx context.Context, lvl slog.Level) bool { return h.next.Enabled(ctx, lvl) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	flat := slog.NewRecord(r.Time, r.Level, Flatten(r.Message), r.PC)
	var key strings.Builder
	key.WriteString(r.Level.String())
	key.WriteByte(0)
	key.WriteString(flat.Message)
	key.WriteByte(0)
	key.WriteString(h.prefix)
	r.Attrs(func(a slog.Attr) bool {
		keyOf(&key, a)
		flat.AddAttrs(flatAttr(a))
		return true
	})
	if r.Level < h.l.o.Level.Level() {
		// An event (a peer connected, manifests reloaded) may end a
		// condition held back: what was held is written first, so that
		// no line comes after the event that replaced it.
		h.l.Flush()
	} else if !h.l.allow(key.String(), flat, h.next) {
		return nil
	}
	return h.next.Handle(ctx, flat)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	var key strings.Builder
	key.WriteString(h.prefix)
	flat := make([]slog.Attr, len(as))
	for i, a := range as {
		keyOf(&key, a)
		flat[i] = flatAttr(a)
	}
	return &handler{l: h.l, next: h.next.WithAttrs(flat), prefix: key.String()}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{l: h.l, next: h.next.WithGroup(name), prefix: h.prefix + "[" + name + "]"}
}

// keyOf adds what names a condition in a: its string and bool values.
// Numbers, durations, times and errors vary between occurrences of one
// condition (a backoff, a count, a port), so they are left out: the line
// that ends a window shows the last of them.
func keyOf(b *strings.Builder, a slog.Attr) {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString, slog.KindBool:
		b.WriteString(a.Key)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(v.String()))
		b.WriteByte(0)
	case slog.KindGroup:
		b.WriteString(a.Key)
		b.WriteByte('{')
		for _, g := range v.Group() {
			keyOf(b, g)
		}
		b.WriteByte('}')
	}
}

// flatAttr is a with no line breaks in its strings and errors, and each
// value of the one type its key has (oneType).
func flatAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); strings.ContainsAny(s, "\r\n") {
			return slog.String(a.Key, Flatten(s))
		}
	case slog.KindAny:
		return slog.Attr{Key: a.Key, Value: oneType(v.Any())}
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, x := range g {
			out[i] = flatAttr(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// oneType is x as a value of the type its key has in every line: an error
// or a Stringer (an address) is its text, flattened, not the struct the JSON
// handler would make of it; a nil slice is an empty list, not null.
func oneType(x any) slog.Value {
	rv := reflect.ValueOf(x)
	if x == nil || (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface) && rv.IsNil() {
		return slog.AnyValue(x)
	}
	switch t := x.(type) {
	case error:
		return slog.StringValue(Flatten(t.Error()))
	case fmt.Stringer:
		return slog.StringValue(Flatten(t.String()))
	}
	if rv.Kind() == reflect.Slice && rv.IsNil() {
		return slog.AnyValue(reflect.MakeSlice(rv.Type(), 0, 0).Interface())
	}
	return slog.AnyValue(x)
}

// Flatten is s on one line: its lines, trimmed and without empty ones,
// joined by "; " (as errors.Join's parts or a stack of wrapped errors).
func Flatten(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	var parts []string
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}

// Route is how a log line writes a route (RouteKey): its relays joined by
// commas, as the metrics' route label does. A field has one type in every
// line, so a route is never a list in one line and a string in another.
func Route(relays []string) string { return strings.Join(relays, ",") }

// RouteKey is the attribute key of a route.
const RouteKey = "route"
