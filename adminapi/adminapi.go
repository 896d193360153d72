// Package adminapi is the API a relay serves to the operator: HTTP/1.1 on
// the relay's TLS port, for a client that negotiates pki.AdminALPN with a
// certificate of the relay CA for pki.OperatorName. It holds both sides
// (Handler for relays, Client for the operator), the request and answer
// types, the paths and the size limits, so the two cannot drift apart.
//
//	GET  /v1/links?chain=NS/NAME&fresh=DURATION       this relay's measure.Table for the chain
//	POST /v1/pipe?chain=NS/NAME  {"routes": [[...]]}   from the entry: a measure.Trace per route
//	GET  /v1/status                                     what only this relay sees go wrong: a Status
//	GET  /v1/clusterset?after=VERSION&wait=DURATION     its cluster's clusterset report, once it is not VERSION
package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/hoplink/hoplink/measure"
)

// Paths. The trace endpoint serves pipe mode and kept its first name, so
// operators and relays one version apart still understand each other.
const (
	PathLinks  = "/v1/links"
	PathTrace  = "/v1/pipe"
	PathStatus = "/v1/status"
	// PathClusterSet serves the relay's Board: its cluster's clusterset
	// report, gzipped JSON, with its version in the VersionHeader.
	PathClusterSet = "/v1/clusterset"
	VersionHeader  = "X-Hoplink-Version"
)

// Limits.
const (
	// MaxTraceRoutes bounds the routes one trace request may measure: the
	// most candidates a chain may ask for, and its current route.
	MaxTraceRoutes = 9
	// MaxRequestBody bounds a request's body.
	MaxRequestBody = 16 << 10
	// MaxAnswer bounds an answer's body, so that a client can refuse more.
	MaxAnswer = measure.MaxTableSize
	// MaxReport bounds a clusterset report's answer: a ConfigMap holds it.
	MaxReport = 1 << 20
	// MaxWait bounds how long a clusterset read waits for a change.
	MaxWait = 30 * time.Second
)

// Status is what a relay reports of itself: the Tunnel entries it should
// open and whether it could, and the problems it saw lately. The operator
// turns them into conditions and Events.
type Status struct {
	Relay    string `json:"relay"`
	Version  string `json:"version,omitempty"`
	Ready    bool   `json:"ready"`
	Draining bool   `json:"draining,omitempty"`
	// CertificateExpires is when the relay's certificate does.
	CertificateExpires time.Time `json:"certificateExpires,omitzero"`
	// Peers are the relays this one sends flows to, as it sees its links.
	Peers []Peer `json:"peers,omitempty"`
	// Chains are the chains this relay enters, with the route new flows take.
	Chains  []ChainRoute `json:"chains,omitempty"`
	Entries []Entry      `json:"entries,omitempty"`
	// Problems are the latest of each kind and Tunnel, at most MaxProblems.
	Problems []Problem `json:"problems,omitempty"`
	// TargetsDown are the targets of the Tunnels this relay exits whose
	// last connect (a probe's or a flow's) failed, most recent first, at
	// most MaxTargetsDown.
	TargetsDown []measure.Target `json:"targetsDown,omitempty"`
	// Congestion is the TCP congestion control of the relay's TLS links.
	Congestion *Congestion `json:"congestion,omitempty"`
	// Limited are the Tunnels this relay held to one of their limits,
	// latest first, at most MaxLimited.
	Limited []LimitHit `json:"limited,omitempty"`
}

// LimitHit says a Tunnel met a limit at this relay. Reason is the reason
// label of the relay's counter that grew: LimitFlows, LimitRateDrop or
// LimitRateWait.
type LimitHit struct {
	Tunnel string `json:"tunnel"`
	Reason string `json:"reason"`
	// Limit is the bound that held when the count last grew, as the
	// Tunnel's spec says it ("spec.limits.maxFlows=100") or, for flows
	// past the relay's own share for one Tunnel, "--max-flows-per-tunnel=N".
	Limit string `json:"limit"`
	// Count is the counter since the relay started: flows refused,
	// datagrams dropped, or seconds flows waited.
	Count float64 `json:"count"`
	// At is when the relay last saw Count grow (it looks when asked).
	At time.Time `json:"at"`
}

// Limit reasons: the reason labels of hoplink_flow_errors_total and
// hoplink_udp_dropped_packets_total, and for TCP flows paced to the rate,
// hoplink_tunnel_rate_wait_seconds_total.
const (
	LimitFlows    = "tunnel_limit"
	LimitRateDrop = "rate_limit"
	LimitRateWait = "rate_wait"
)

// MaxLimited bounds the limit hits a relay reports.
const MaxLimited = 64

// Congestion is the TCP congestion control a relay's TLS links run: what
// its RelayNode asks (auto or a name), what runs, why (auto, pinned,
// not_allowed, not_available, unsupported) and, when it is not what was
// asked, what to do.
type Congestion struct {
	Want      string `json:"want"`
	Algorithm string `json:"algorithm,omitempty"`
	Reason    string `json:"reason"`
	Fix       string `json:"fix,omitempty"`
	// SendBuffer is the most one link socket may queue to send, in bytes:
	// the third figure of net.ipv4.tcp_wmem where the relay runs, which
	// bounds one TLS flow to about half of it per round trip.
	SendBuffer int64 `json:"sendBuffer,omitempty"`
}

// Peer is a relay's link to a next hop: whether it carries flows now, and
// the QUIC connection's figures (smoothed round trip, its mean variation,
// and the share of packets lost).
type Peer struct {
	Name     string           `json:"name"`
	Up       bool             `json:"up"`
	Draining bool             `json:"draining,omitempty"`
	RTT      measure.Duration `json:"rtt,omitempty"`
	Jitter   measure.Duration `json:"jitter,omitempty"`
	Loss     float64          `json:"loss"`
	// Family is the IP family (ipv4, ipv6) the connection runs on while it
	// is up: with endpoints of both, the one that answered first.
	Family string `json:"family,omitempty"`
	// Transport is what bulk flows of transport: auto chains take on the
	// link now, and why.
	Transport       string `json:"transport,omitempty"`
	TransportReason string `json:"transportReason,omitempty"`
}

// ChainRoute is a chain this relay enters: its route now and, for a
// routed chain, the last round's reason and candidates.
type ChainRoute struct {
	Chain string   `json:"chain"`
	Mode  string   `json:"mode"`
	Route []string `json:"route,omitempty"`
	// Reason is why the route is what it is (routed chains).
	Reason string `json:"reason,omitempty"`
	// Changed is when the route last changed (routed chains).
	Changed time.Time `json:"changed,omitzero"`
	// Kept says why the route stays although the last round found a
	// cheaper candidate (hysteresis); empty when none is cheaper.
	Kept       string      `json:"kept,omitempty"`
	Candidates []Candidate `json:"candidates,omitempty"`
}

// Candidate is a route the last round priced.
type Candidate struct {
	Route     []string         `json:"route"`
	Cost      measure.Duration `json:"cost"`
	Estimated measure.Duration `json:"estimated,omitempty"`
	Measured  measure.Duration `json:"measured,omitempty"`
}

// Entry is a Tunnel's entry on this relay: open, or why not.
type Entry struct {
	Tunnel string `json:"tunnel"`
	Listen string `json:"listen,omitempty"`
	Open   bool   `json:"open"`
	Error  string `json:"error,omitempty"`
	// Flows is how many flows of the Tunnel enter here now.
	Flows int64 `json:"flows"`
	// Limits are the Tunnel's spec.limits, as "20 Mbit/s, 100 flows";
	// empty without.
	Limits string `json:"limits,omitempty"`
}

// Problem kinds.
const (
	ProblemDialTarget = "dial_target" // the exit could not connect to a Tunnel's target
	ProblemHandshake  = "handshake"   // a peer's handshake was refused (certificate, unknown relay)
	ProblemDevice     = "device"      // a Tunnel's TUN device could not open at the exit
	ProblemEgress     = "egress"      // the exit's egress policy refused a target or a route (a host-network relay's node)
)

// Problem is one kind of failure, for one Tunnel (or none): how often since
// the relay started, and the last one.
type Problem struct {
	Kind   string    `json:"kind"`
	Tunnel string    `json:"tunnel,omitempty"`
	Count  int64     `json:"count"`
	Last   string    `json:"last"`
	At     time.Time `json:"at"`
}

// MaxProblems bounds the problems a relay keeps and reports.
const MaxProblems = 64

// MaxTargetsDown bounds the targets down a relay's status lists (an
// answer is at most MaxAnswer).
const MaxTargetsDown = 32

// TraceRequest is the body of a trace request.
type TraceRequest struct {
	Routes [][]string `json:"routes"`
}

// Error is an answer that refuses a request: its HTTP status, and the body
// {"reason": ..., "error": ...}.
type Error struct {
	Status int    `json:"-"`
	Reason string `json:"reason"`
	Msg    string `json:"error"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%s)", e.Msg, e.Reason) }

// NotFound refuses a request about something this relay does not serve.
func NotFound(reason string, err error) *Error {
	return &Error{Status: http.StatusNotFound, Reason: reason, Msg: err.Error()}
}

// BadRequest refuses a malformed request.
func BadRequest(reason string, err error) *Error {
	return &Error{Status: http.StatusBadRequest, Reason: reason, Msg: err.Error()}
}

type clientKey struct{}

// WithClient records the name the client's certificate proved, for the
// handler: the TLS endpoint that accepted the connection knows it.
func WithClient(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, clientKey{}, name)
}

// ClientOf is the name WithClient recorded, or "".
func ClientOf(ctx context.Context) string {
	s, _ := ctx.Value(clientKey{}).(string)
	return s
}
