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
type ChainSpec struct {
	// Entry is the RelayNode where traffic enters the chain.
	Entry string `json:"entry"`
	// Exit is the RelayNode that dials the target.
	Exit string `json:"exit"`
	// Via lists the RelayNodes a route may pass through between entry and exit.
	// +optional
	Via []string `json:"via,omitempty"`
	// Mode chooses how the route is picked.
	// +kubebuilder:default=static
	// +optional
	Mode RouteMode `json:"mode,omitempty"`
	// Route is the ordered list of RelayNodes a flow crosses, from entry to
	// exit. Required for static mode. A route of one relay (entry == exit)
	// is a plain port forward.
	// +optional
	Route []string `json:"route,omitempty"`
	// Transport between the chain's relays for TCP flows.
	// +kubebuilder:default=quic
	// +optional
	Transport Transport `json:"transport,omitempty"`
}

// ChainStatus is the route in use and why the chain is or is not usable.
type ChainStatus struct {
	// Route currently used by new flows.
	// +optional
	Route []string `json:"route,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Chain is a path of relays that Tunnels send their flows along.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
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
