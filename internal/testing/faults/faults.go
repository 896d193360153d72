// Package faults measures how an application sees a flow end when a relay
// under it dies. Three `hoplink relay` processes (hk -> m -> la) carry a
// paced transfer of a known pattern between a client and a target of this
// process; one relay is killed (SIGKILL) in the middle of it, and both
// applications report how the flow ended for them: a clean end of stream,
// an error, or nothing. A crash must cost a flow an error at both ends,
// never a clean but short stream: that is the defect this instrument finds.
package faults

import (
	"fmt"
	"strings"
	"time"
)

// Case is one transfer and one kill.
type Case struct {
	Transport string        // the Chain's transport: "quic" or "tls"
	Role      string        // the relay killed: "entry" (hk), "middle" (m) or "exit" (la)
	Direction string        // "upload": the client sends to the target; "download": the target sends
	Size      int64         // bytes the sender sends
	Pace      time.Duration // how long the sender spreads them over
	KillAfter time.Duration // from the sender's first byte to the kill
	Wait      time.Duration // how long after the kill an end may take before it counts as none (0: 15 s)
}

// The values a Case's fields take.
var (
	Transports = []string{"quic", "tls"}
	Roles      = []string{"entry", "middle", "exit"}
	Directions = []string{"upload", "download"}
)

// relayOf names the relay of each role: the chain is hk -> m -> la.
var relayOf = map[string]string{"entry": "hk", "middle": "m", "exit": "la"}

// Cases is base for every transport, role and direction, in that order.
func Cases(base Case) []Case {
	var out []Case
	for _, tr := range Transports {
		for _, role := range Roles {
			for _, dir := range Directions {
				c := base
				c.Transport, c.Role, c.Direction = tr, role, dir
				out = append(out, c)
			}
		}
	}
	return out
}

func (c Case) String() string {
	return fmt.Sprintf("%s/%s/%s", c.Transport, c.Role, c.Direction)
}

func (c Case) wait() time.Duration {
	if c.Wait > 0 {
		return c.Wait
	}
	return 15 * time.Second
}

func (c Case) check() error {
	if c.Transport != "quic" && c.Transport != "tls" {
		return fmt.Errorf("transport %q: want quic or tls", c.Transport)
	}
	if relayOf[c.Role] == "" {
		return fmt.Errorf("role %q: want entry, middle or exit", c.Role)
	}
	if c.Direction != "upload" && c.Direction != "download" {
		return fmt.Errorf("direction %q: want upload or download", c.Direction)
	}
	if c.Size <= 0 || c.Pace <= 0 || c.KillAfter <= 0 {
		return fmt.Errorf("size, pace and kill time must be positive")
	}
	return nil
}

// How is how an application saw its flow end.
type How string

const (
	Clean How = "clean" // end of stream, as if the peer had closed
	Reset How = "reset" // a read or write failed (a reset, a broken pipe)
	None  How = "none"  // nothing within the Case's Wait after the kill
)

// End is what one application saw: the first of an end of stream read, a
// failed read and a failed write. A sender's finishing its writes is no
// end: it half-closes and waits for the other side to close. An end of
// stream that a connection reset (ECONNRESET) follows was the reset's: a
// sender reads and writes at once, and the kernel reports a reset to one
// of the two calls, while the other sees the connection's end as a plain
// end of stream.
type End struct {
	How   How
	After time.Duration // from the kill to the end; negative if it came before
	Err   string        // the failure, for a reset
	Then  string        // after a clean end, an error that followed it within a second
}

// Result is a Case as measured.
type Result struct {
	Case     Case
	Client   End    // the application that dialled the Tunnel
	Target   End    // the application the exit dialled
	Sent     int64  // bytes the sender's writes took
	Received int64  // bytes the receiving application read
	Differs  bool   // a received byte differed from the pattern
	Dir      string // the relays' manifests, certificates and logs
}

// Prompt is how soon after a kill both ends must see an error.
const Prompt = 10 * time.Second

// Verdicts, in the order Verdict tries them.
const (
	Corrupt   = "CORRUPT"   // a byte received differed from what was sent
	Missed    = "MISSED"    // every byte arrived: the kill did not cut the transfer
	Truncated = "TRUNCATED" // an end saw a clean end of stream, and the receiver got less than was sent
	Hung      = "HUNG"      // an end saw nothing
	Slow      = "SLOW"      // an end saw its error later than Prompt after the kill
	Early     = "EARLY"     // an end saw its end before the kill: the case measured something else
	OK        = "ok"        // both ends saw an error within Prompt, and no byte differed
)

// Verdict judges a Result: only OK is what a relay's crash should cost.
func (r Result) Verdict() string {
	ends := []End{r.Client, r.Target}
	has := func(f func(End) bool) bool {
		for _, e := range ends {
			if f(e) {
				return true
			}
		}
		return false
	}
	switch {
	case r.Differs:
		return Corrupt
	case r.Received >= r.Case.Size:
		return Missed
	case r.Received < r.Case.Size && has(func(e End) bool { return e.How == Clean }):
		return Truncated
	case has(func(e End) bool { return e.How == None }):
		return Hung
	case has(func(e End) bool { return e.After > Prompt }):
		return Slow
	case has(func(e End) bool { return e.After < 0 }):
		return Early
	}
	return OK
}

// Detail says what each end saw, with errors, for a failure message.
func (r Result) Detail() string {
	end := func(e End) string {
		s := string(e.How)
		if e.How != None {
			s += " " + e.After.Round(time.Millisecond).String() + " after the kill"
		}
		if e.Err != "" {
			s += " (" + e.Err + ")"
		}
		if e.Then != "" {
			s += ", then " + e.Then
		}
		return s
	}
	return fmt.Sprintf("%s: %s; client %s; target %s; %d of %d bytes received, %d sent; relay logs in %s",
		r.Case, r.Verdict(), end(r.Client), end(r.Target), r.Received, r.Case.Size, r.Sent, r.Dir)
}

// Table is a markdown table of results, one row each.
func Table(rs []Result) string {
	var b strings.Builder
	b.WriteString("| transport | killed | direction | received | client end | target end | client after kill | target after kill | byte differs | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	after := func(e End) string {
		if e.How == None {
			return "—"
		}
		return fmt.Sprintf("%.2f s", e.After.Seconds())
	}
	how := func(e End) string {
		if e.Then != "" {
			return string(e.How) + ", then reset"
		}
		return string(e.How)
	}
	for _, r := range rs {
		differs := "no"
		if r.Differs {
			differs = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s (%s) | %s | %s of %s | %s | %s | %s | %s | %s | %s |\n",
			r.Case.Transport, r.Case.Role, relayOf[r.Case.Role], r.Case.Direction,
			mib(r.Received), mib(r.Case.Size), how(r.Client), how(r.Target),
			after(r.Client), after(r.Target), differs, r.Verdict())
	}
	return b.String()
}

func mib(n int64) string {
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}
