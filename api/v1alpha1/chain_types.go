package v1alpha1

import (
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
	// ModePipe picks the path with the lowest latency measured end to end.
	ModePipe RouteMode = "pipe"
)

// Transport carries a chain's TCP flows between relays.
// +kubebuilder:validation:Enum=quic;tls
type Transport string

const (
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
	// is a plain port forward.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Route []string `json:"route,omitempty"`
	// Transport between the chain's relays for TCP flows.
	// +kubebuilder:default=quic
	// +optional
	Transport Transport `json:"transport,omitempty"`
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
	// Latency is the route's latency as last estimated by the route
	// controller (sum and pipe modes).
	// +optional
	Latency *metav1.Duration `json:"latency,omitempty"`
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
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Route",type=string,JSONPath=`.status.route`
// +kubebuilder:printcolumn:name="Latency",type=string,JSONPath=`.status.latency`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
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
