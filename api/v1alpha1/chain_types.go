package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RouteMode says how a Chain's route is chosen.
// +kubebuilder:validation:Enum=static;sum;pipe
type RouteMode string

const (
	// ModeStatic uses spec.route as written.
	ModeStatic RouteMode = "static"
	// ModeSum picks the path with the lowest sum of probed link latencies.
	ModeSum RouteMode = "sum"
	// ModePipe measures the cheapest few sum-mode paths end to end through
	// the relays and picks the fastest.
	ModePipe RouteMode = "pipe"
)

// Routed reports whether the mode chooses routes by measurement.
func (m RouteMode) Routed() bool { return m == ModeSum || m == ModePipe }

// Transport carries a chain's TCP flows between relays.
// +kubebuilder:validation:Enum=auto;quic;tls
type Transport string

const (
	// TransportAuto lets each relay choose per link and per flow: short
	// and interactive flows ride QUIC (it opens a flow fastest and recovers
	// a lost packet soonest), bulk TCP, packet sessions and the sessions of
	// bulk UDP Tunnels take whichever transport moved bulk flows faster on
	// that link, re-measured by sampling; before the first measurement TLS
	// (packet sessions on a lossy link: QUIC). Other UDP sessions ride QUIC
	// datagrams.
	TransportAuto Transport = "auto"
	// TransportQUIC: one QUIC connection per peer, a stream per flow.
	TransportQUIC Transport = "quic"
	// TransportTLS: a TLS 1.3 over TCP connection per flow, taken from a
	// pool kept warm per peer. Faster for bulk TCP on clean links, where
	// the kernel's TCP offloads beat QUIC's per-packet UDP path; UDP
	// Tunnels of the chain still use QUIC.
	TransportTLS Transport = "tls"
)

// ChainSpec names the relays a flow may cross from entry to exit.
//
// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode != 'static') || (has(self.route) && size(self.route) > 0)",message="spec.route is required when spec.mode is static: list the relays from spec.entry to spec.exit"
// +kubebuilder:validation:XValidation:rule="!has(self.route) || size(self.route) == 0 || self.route[0] == self.entry",message="spec.route must start at spec.entry"
// +kubebuilder:validation:XValidation:rule="!has(self.route) || size(self.route) == 0 || self.route[size(self.route) - 1] == self.exit",message="spec.route must end at spec.exit"
// +kubebuilder:validation:XValidation:rule="!has(self.route) || self.route.all(r, r == self.entry || r == self.exit || (has(self.via) && r in self.via))",message="spec.route may name only spec.entry, spec.exit and relays listed in spec.via"
// +kubebuilder:validation:XValidation:rule="!has(self.route) || self.route.all(r, self.route.exists_one(x, x == r))",message="spec.route names a relay more than once"
// +kubebuilder:validation:XValidation:rule="!has(self.route) || !has(self.mode) || self.mode == 'static' || !has(self.maxHops) || size(self.route) <= self.maxHops + 1",message="spec.route has more links than spec.maxHops allows"
type ChainSpec struct {
	// Entry is the RelayNode where traffic enters the chain.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.entry is immutable: create a new Chain for another entry relay"
	Entry string `json:"entry"`
	// Exit is the RelayNode that dials the target.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.exit is immutable: create a new Chain for another exit relay"
	Exit string `json:"exit"`
	// Via lists the RelayNodes a route may pass through between entry and exit.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Via []string `json:"via,omitempty"`
	// Mode chooses how the route is picked.
	// +kubebuilder:default=static
	// +optional
	Mode RouteMode `json:"mode,omitempty"`
	// Route is the ordered list of RelayNodes a flow crosses, from entry to
	// exit. Required for static mode. A route of one relay (entry == exit)
	// is a plain port forward. In sum and pipe modes it is optional: the
	// route new flows take until the first measurement.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Route []string `json:"route,omitempty"`
	// Transport between the chain's relays for TCP flows and packet
	// sessions: auto (each link chooses by measurement), quic or tls. UDP
	// Tunnels ride QUIC, except under auto the sessions of a bulk one
	// (udp.mode stream, or sessions above 16,000 datagrams a second), which
	// take the link's bulk transport.
	// +kubebuilder:default=auto
	// +optional
	Transport Transport `json:"transport,omitempty"`
	// MaxHops bounds the links of a route that sum and pipe modes may
	// choose: 1 allows only entry -> exit.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=15
	// +kubebuilder:default=4
	// +optional
	MaxHops int32 `json:"maxHops,omitempty"`
	// Probe says how often the links are measured and how many routes pipe
	// mode measures end to end (sum and pipe modes).
	// +optional
	Probe *ProbeSpec `json:"probe,omitempty"`
	// Hysteresis keeps the route from flapping: a route replaces the current
	// one only when it is faster by the margin in consecutive rounds (sum and
	// pipe modes). A route whose relay or link is down is replaced at once.
	// +optional
	Hysteresis *HysteresisSpec `json:"hysteresis,omitempty"`
}

// Defaults of the routing fields.
const (
	DefaultMaxHops           = 4
	DefaultProbeInterval     = 2 * time.Second
	DefaultProbeCandidates   = 3
	DefaultHysteresisPercent = 5
	DefaultHysteresisMin     = 2 * time.Millisecond
	DefaultHysteresisRounds  = 2
)

// ProbeSpec tunes the measurements a routed chain's decisions rest on.
type ProbeSpec struct {
	// Interval between measurement rounds: every round measures each link
	// the chain may use and decides the route again.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms') && duration(self) <= duration('10m')",message="spec.probe.interval must be between 100ms and 10m"
	// +kubebuilder:default="2s"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
	// Candidates is how many of the cheapest routes by summed link latency
	// pipe mode measures end to end each round (the current route always is).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	// +kubebuilder:default=3
	// +optional
	Candidates int32 `json:"candidates,omitempty"`
}

// HysteresisSpec is the margin by which a route must beat the current one.
// The margin is the larger of Percent of the current route's latency and Min.
type HysteresisSpec struct {
	// Percent of the current route's latency.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=5
	// +optional
	Percent *int32 `json:"percent,omitempty"`
	// Min is the smallest margin, whatever the percentage gives.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(us|ms|s))+$`
	// +kubebuilder:default="2ms"
	// +optional
	Min *metav1.Duration `json:"min,omitempty"`
	// Rounds is how many consecutive rounds the better route must win.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=2
	// +optional
	Rounds int32 `json:"rounds,omitempty"`
}

// RouteLatency is a route's latency two ways: estimated as the sum of its
// links' measured round trips plus the exit's round trip to the target, and
// measured by a probe that crosses the real relays.
type RouteLatency struct {
	// +optional
	Estimated *metav1.Duration `json:"estimated,omitempty"`
	// +optional
	Measured *metav1.Duration `json:"measured,omitempty"`
}

// RouteCandidate is a route the route controller considered in its last
// round, with what it cost.
type RouteCandidate struct {
	// +kubebuilder:validation:MaxItems=16
	Route []string `json:"route"`
	// +optional
	Latency RouteLatency `json:"latency,omitempty"`
}

// LinkTransport is the transport a relay chose for a link's bulk flows.
type LinkTransport struct {
	// From and To are the link's relays.
	From string `json:"from"`
	To   string `json:"to"`
	// Transport is quic or tls.
	Transport Transport `json:"transport"`
	// Reason: measured (bulk flows' goodput compared) or unmeasured (TLS
	// until both transports have carried bulk flows).
	// +optional
	Reason string `json:"reason,omitempty"`
}

// ChainStatus is the route in use and why the chain is or is not usable.
type ChainStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Route currently used by new flows. Relays read it: in static mode it
	// is spec.route once every relay on it exists; in sum and pipe mode the
	// route controller writes it.
	// +optional
	Route []string `json:"route,omitempty"`
	// Latency of the route in use (sum and pipe modes), as of the round
	// that last wrote the status: one that changed the route or measured
	// what the status lacked, and otherwise one a minute at most; every
	// round's figures are in the metric hoplink_chain_latency_seconds.
	// +optional
	Latency *RouteLatency `json:"latency,omitempty"`
	// Candidates are the routes the round that last wrote the status
	// considered (see latency), best first: in sum mode by estimated
	// latency, in pipe mode by measured latency.
	// +kubebuilder:validation:MaxItems=9
	// +optional
	Candidates []RouteCandidate `json:"candidates,omitempty"`
	// LastRouteChange is when the route controller last changed the route.
	// +optional
	LastRouteChange *metav1.Time `json:"lastRouteChange,omitempty"`
	// RouteChanges counts the route controller's changes of the route.
	// +optional
	RouteChanges int64 `json:"routeChanges,omitempty"`
	// Transports says, for each link of the route, the transport its relay
	// chose for bulk flows under transport: auto and why (sum and pipe
	// modes; relays of other chains say it in hoplink_link_transport_info).
	// +kubebuilder:validation:MaxItems=15
	// +optional
	Transports []LinkTransport `json:"transports,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Chain is a path of relays that Tunnels send their flows along.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ch,categories=hoplink
// +kubebuilder:printcolumn:name="Entry",type=string,JSONPath=`.spec.entry`
// +kubebuilder:printcolumn:name="Exit",type=string,JSONPath=`.spec.exit`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Route",type=string,JSONPath=`.status.route`
// +kubebuilder:printcolumn:name="Latency",type=string,JSONPath=`.status.latency.measured`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Changes",type=integer,JSONPath=`.status.routeChanges`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Chain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ChainSpec   `json:"spec,omitempty"`
	Status ChainStatus `json:"status,omitempty"`
}

// ChainList is a list of Chains.
//
// +kubebuilder:object:root=true
type ChainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Chain `json:"items"`
}
