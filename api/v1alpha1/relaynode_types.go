package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultRelayPort is the relay-to-relay port (QUIC over UDP) when a
// RelayNode does not set spec.listen.port.
const DefaultRelayPort = 7401

// RelayListen is where a relay accepts QUIC connections from its peers.
type RelayListen struct {
	// Address to bind; empty binds every address.
	// +optional
	Address string `json:"address,omitempty"`
	// Port is the UDP port for relay-to-relay QUIC.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=7401
	// +optional
	Port int32 `json:"port,omitempty"`
}

// RelayNodeSpec describes one relay: where it listens and how peers reach it.
type RelayNodeSpec struct {
	// Listen is the relay-to-relay listener.
	// +optional
	Listen RelayListen `json:"listen,omitempty"`
	// Endpoints are the host:port addresses peers dial to reach this relay,
	// tried in order. Required outside a cluster.
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
}

// RelayNodeStatus is what the operator observed of a RelayNode.
type RelayNodeStatus struct {
	// Endpoints peers use to reach this relay.
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RelayNode is one relay of the hoplink network.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rn
type RelayNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RelayNodeSpec   `json:"spec,omitempty"`
	Status RelayNodeStatus `json:"status,omitempty"`
}

// RelayNodeList is a list of RelayNodes.
//
// +kubebuilder:object:root=true
type RelayNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RelayNode `json:"items"`
}
