// Package measure holds what relays measure and route controllers read: a
// relay's Table for a chain (its links' round trip, jitter and loss, and at
// the exit its targets' connect time) and the end-to-end Trace of a route.
// Relays fill them in (relay/probe, relay traces); the route loop
// (routectl) and the operator read them, over the admin API or in process.
// Plain data: no I/O.
package measure

import (
	"encoding/json"
	"time"
)

// Duration is a time.Duration that reads well in JSON ("76.2ms").
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).Round(time.Microsecond).String())
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Link is what a relay measured on its link to one peer.
type Link struct {
	To string `json:"to"`
	// Up: the last round got an answer to at least one probe.
	Up bool `json:"up"`
	// RTT is the median probe round trip of the last round: what routes
	// are chosen by, since it follows a change within one round.
	RTT Duration `json:"rtt,omitempty"`
	// Min is the least probe round trip of the recent rounds.
	Min Duration `json:"min,omitempty"`
	// Smoothed is QUIC's smoothed RTT of the connection.
	Smoothed Duration `json:"smoothed,omitempty"`
	// Jitter is the mean variation between successive probe round trips.
	Jitter Duration `json:"jitter,omitempty"`
	// Loss is the share of probes of the recent rounds that got no answer.
	Loss float64 `json:"loss"`
	// Age is how long before the table was made the last round ended.
	Age Duration `json:"age"`
	// Transport is what the link's bulk flows of transport: auto chains
	// take now, and why; empty before the relay chose.
	Transport       string `json:"transport,omitempty"`
	TransportReason string `json:"transportReason,omitempty"`
	// Draining: the peer said it drains (a planned stop, not a failure).
	Draining bool `json:"draining,omitempty"`
	// Family is the IP family (ipv4, ipv6) the link's connection runs on,
	// empty while it has none.
	Family string `json:"family,omitempty"`
}

// Target is an exit relay's measurement of a Tunnel's target.
type Target struct {
	Tunnel string `json:"tunnel"`
	Target string `json:"target"`
	// Up: the last connect succeeded.
	Up bool `json:"up"`
	// Error says why the last connect failed (refused, timed out, refused
	// by the exit's egress policy).
	Error string `json:"error,omitempty"`
	// RTT is the last TCP connect time: one round trip to the target.
	RTT Duration `json:"rtt,omitempty"`
	Age Duration `json:"age"`
}

// Table is one relay's measurements for one chain.
type Table struct {
	Relay   string   `json:"relay"`
	Links   []Link   `json:"links,omitempty"`
	Targets []Target `json:"targets,omitempty"`
}

// Trace is a route measured end to end: a few trace streams sent through
// the real relays, to the exit and back, as a TCP flow would travel.
type Trace struct {
	Route []string `json:"route"`
	// RTT is the median of the traces' round trips, entry to exit and back.
	RTT Duration `json:"rtt,omitempty"`
	// Err says why the route could not be measured.
	Err string `json:"error,omitempty"`
}

// MaxTableSize bounds an encoded Table, so that a reader can refuse more.
const MaxTableSize = 64 << 10
