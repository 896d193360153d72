package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Protocol is what a Tunnel carries.
// +kubebuilder:validation:Enum=tcp;udp
type Protocol string

const (
	// ProtocolTCP forwards TCP connections, one QUIC stream each.
	ProtocolTCP Protocol = "tcp"
	// ProtocolUDP forwards UDP datagrams, one session per client address.
	ProtocolUDP Protocol = "udp"
)

// Defaults for UDP sessions.
const (
	DefaultUDPIdleTimeout = 60 // seconds
	DefaultUDPMaxSessions = 4096
)

// TunnelListen is the address a Tunnel opens on its chain's entry relay.
type TunnelListen struct {
	// Address to bind on the entry relay; empty binds every address.
	// +optional
	Address string `json:"address,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// UDPOptions tune UDP session handling.
type UDPOptions struct {
	// IdleTimeoutSeconds closes a session after this long without traffic in
	// either direction.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=60
	// +optional
	IdleTimeoutSeconds int32 `json:"idleTimeoutSeconds,omitempty"`
	// MaxSessions bounds the session table of the entry relay; a new client
	// beyond it is dropped (and counted) until a session ends.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=4096
	// +optional
	MaxSessions int32 `json:"maxSessions,omitempty"`
}

// TunnelSpec is one forwarded service: a listener on the chain's entry relay
// and the target its exit relay dials.
//
// +kubebuilder:validation:XValidation:rule="!has(self.udp) || (has(self.protocol) && self.protocol == 'udp')",message="spec.udp applies only to protocol udp: remove it or set spec.protocol: udp"
type TunnelSpec struct {
	// Chain is the name of the Chain this Tunnel's flows travel.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Chain string `json:"chain"`
	// Protocol is tcp or udp.
	// +kubebuilder:default=tcp
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.protocol is immutable: create a new Tunnel for another protocol"
	// +optional
	Protocol Protocol `json:"protocol,omitempty"`
	// Listen is opened on the chain's entry relay.
	Listen TunnelListen `json:"listen"`
	// Target is the host:port the exit relay dials. It is the only
	// destination this Tunnel can reach.
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	Target string `json:"target"`
	// UDP tunes UDP sessions; ignored for tcp.
	// +optional
	UDP *UDPOptions `json:"udp,omitempty"`
}

// TunnelStatus says where clients connect and whether the Tunnel works.
type TunnelStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Address clients in the cluster use: the Tunnel's Service,
	// NAME.NAMESPACE.svc:PORT.
	// +optional
	Address string `json:"address,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Tunnel forwards a port on a chain's entry relay to a target behind its exit.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tnl,categories=hoplink
// +kubebuilder:printcolumn:name="Chain",type=string,JSONPath=`.spec.chain`
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.spec.protocol`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Tunnel struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TunnelSpec   `json:"spec,omitempty"`
	Status TunnelStatus `json:"status,omitempty"`
}

// TunnelList is a list of Tunnels.
//
// +kubebuilder:object:root=true
type TunnelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Tunnel `json:"items"`
}
