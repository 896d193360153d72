package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultRelayPort is the relay-to-relay port (QUIC over UDP) when a
// RelayNode does not set spec.listen.port.
const DefaultRelayPort = 7401

// DefaultDrainSeconds is how long a relay told to stop (SIGTERM) lets its
// open flows go on while it takes no new ones.
const DefaultDrainSeconds = 30

// LabelRelayNode marks the pods (and the objects) of one RelayNode: the
// relay DaemonSet's pods, and the workload pods that get a sidecar relay.
const LabelRelayNode = "hoplink.dev/relaynode"

// LabelEgressHost, set to "true" on a namespace, allows its Tunnels the
// node's network at host-network exits: loopback, link-local and cloud
// metadata addresses, the node's own addresses, and TUN routes over the
// node's routes. Without it the operator runs host-network relays with
// --refuse-node-egress.
const LabelEgressHost = "hoplink.dev/egress-host"

// LabelMemberPrefix starts the labels that say which relays read an
// object: the operator writes MemberLabel(relay) on every Chain for each
// relay its spec names, on the Chain's Tunnels, on the RelayNodes those
// relays need (each its own too) and on sidecar relays' Services (whose
// EndpointSlices copy them). A relay watches only what carries its own,
// so what it caches, and what the API server sends it, grows with its
// chains and not with its namespace. RelayNode names are DNS labels, so
// the key's name part (at most 63 characters) always holds one.
const LabelMemberPrefix = "member.hoplink.dev/"

// MemberLabel is the label key that selects relay's objects.
func MemberLabel(relay string) string { return LabelMemberPrefix + relay }

// MemberJoining is the value of a Chain's member label while the relay it
// names has just been added to the Chain: that relay takes the new spec
// first, and the others once the label's value is empty, a moment later,
// so that no flow reaches a relay before it knows the Chain.
const MemberJoining = "joining"

// ReasonNameConflict is the Ready reason the operator writes on a RelayNode
// that does not hold its name: one of another namespace does, being older
// or of the same second. Relays read it, so it is part of the API.
const ReasonNameConflict = "NameConflict"

// RelayPort is the relay-to-relay port (QUIC on UDP, TLS on TCP).
func (s *RelayNodeSpec) RelayPort() int32 {
	if s.Listen.Port > 0 {
		return s.Listen.Port
	}
	return DefaultRelayPort
}

// MetricsPort is where a relay in a cluster serves /metrics, /healthz and
// /readyz: the relay port plus one, so relays sharing a network do not collide.
func (s *RelayNodeSpec) MetricsPort() int32 {
	if p := s.Listen.Port; p > 0 && p < 65535 {
		return p + 1
	}
	return DefaultRelayPort + 1
}

// RelayObjectName names the objects the operator makes for a RelayNode (its
// DaemonSet, ServiceAccount, RBAC and the certificate Secret its relays read).
func RelayObjectName(relay string) string { return "hoplink-relay-" + relay }

// RelayListen is where a relay accepts QUIC connections from its peers.
type RelayListen struct {
	// Address to bind; empty binds every address.
	// +optional
	Address string `json:"address,omitempty"`
	// Port is the relay-to-relay port: QUIC on UDP and TLS on TCP. In a
	// cluster the relay serves metrics and probes on the next port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65534
	// +kubebuilder:default=7401
	// +optional
	Port int32 `json:"port,omitempty"`
}

// RelayNodeSpec describes one relay: where it listens, how peers reach it
// and, in a cluster, where its pods run.
//
// +kubebuilder:validation:XValidation:rule="!has(self.external) || !self.external || (has(self.endpoints) && size(self.endpoints) > 0)",message="spec.endpoints is required when spec.external is true: list the host:port addresses where peers reach that relay"
// +kubebuilder:validation:XValidation:rule="!has(self.sidecar) || !has(self.external) || !self.external",message="spec.sidecar and spec.external exclude each other: a sidecar relay runs in this cluster's labelled pods; remove one"
// +kubebuilder:validation:XValidation:rule="!has(self.sidecar) || !has(self.hostNetwork) || !self.hostNetwork",message="spec.hostNetwork cannot be true with spec.sidecar: sidecar relays run in their workload's pod network; remove spec.hostNetwork"
// +kubebuilder:validation:XValidation:rule="!has(self.sidecar) || (!has(self.nodeSelector) && !has(self.tolerations))",message="spec.nodeSelector and spec.tolerations do not apply with spec.sidecar: the workload's own pod spec places its pods; remove them"
// +kubebuilder:validation:XValidation:rule="!has(self.sidecar) || !has(self.endpoints)",message="spec.endpoints cannot be set with spec.sidecar: peers reach the ready replicas through the headless Service hoplink-relay-<name>; remove spec.endpoints"
type RelayNodeSpec struct {
	// Listen is the relay-to-relay listener.
	// +optional
	Listen RelayListen `json:"listen,omitempty"`
	// Endpoints are the host:port addresses peers dial to reach this relay,
	// tried in order. Required outside a cluster; in a cluster they replace
	// the node or pod addresses the operator would publish.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// External marks a relay that runs outside this cluster (another
	// cluster, a VM): the operator issues its certificate and publishes its
	// spec.endpoints, but runs no pods for it.
	// +optional
	External bool `json:"external,omitempty"`
	// HostNetwork runs relay pods in the node's network namespace, so the
	// relay port is reachable at the node's address from outside the
	// cluster. Pod-network relays are reachable inside the cluster only.
	// Unset means true for DaemonSet relays; sidecar relays never use it.
	// The operator's default policy runs host-network relays only in
	// namespaces labelled hoplink.dev/privileged-relays=true (`kubectl
	// label namespace NAMESPACE hoplink.dev/privileged-relays=true`, an
	// admin's decision; or the operator runs with --privileged-relays=any,
	// chart value relay.privileged): elsewhere the RelayNode runs nothing
	// and says so, Ready=False with reason PrivilegesNotAllowed, in
	// `kubectl get relaynodes` and in a Warning Event. Set false for a relay
	// that only this cluster's pods reach, which every namespace allows.
	// +optional
	HostNetwork *bool `json:"hostNetwork,omitempty"`
	// NodeSelector picks the nodes that run this relay (one pod per node).
	// Selecting control-plane nodes (node-role.kubernetes.io/control-plane)
	// is refused unless the namespace is labelled
	// hoplink.dev/control-plane-relays=true (reason ControlPlaneNotAllowed).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the relay pods. Tolerating the control-plane taint, or
	// every taint (no key, operator Exists), is refused unless the
	// namespace is labelled hoplink.dev/control-plane-relays=true (reason
	// ControlPlaneNotAllowed): relays there share a node with the API
	// server and etcd.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Resources of the relay container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// Image overrides the relay image the operator runs.
	// +optional
	Image string `json:"image,omitempty"`
	// TUN lets the relay open TUN devices, for the tun Tunnels it enters
	// and the packet-mode ones it exits: its pods then run as root with
	// CAP_NET_ADMIN (every other capability still dropped) and the node's
	// /dev/net/tun. With host networking the devices and their routes are
	// the node's. Off by default: a relay needs no privileges otherwise.
	// +optional
	TUN bool `json:"tun,omitempty"`
	// Sidecar makes this RelayNode stand for relays injected into the pods
	// of this namespace labelled hoplink.dev/relaynode=<name>, instead of a
	// DaemonSet: every replica serves the same relay name. Chains name it as
	// their entry (the pod's apps dial localhost:<listen port>) or exit
	// (targets are dialed from inside the pod).
	// +optional
	Sidecar *RelaySidecar `json:"sidecar,omitempty"`
	// Links tunes this relay's connections to other relays.
	// +optional
	Links *RelayLinks `json:"links,omitempty"`
}

// CongestionControlAuto lets a relay choose its links' TCP congestion
// control (spec.links.congestionControl).
const CongestionControlAuto = "auto"

// RelayLinks tunes a relay's connections to other relays.
type RelayLinks struct {
	// CongestionControl is the TCP congestion control of this relay's TLS
	// links: the connections it dials and the ones it accepts (each
	// direction of a connection runs its sender's). "auto", the default,
	// runs bbr where the kernel lets the relay, whatever the host's default:
	// on a long leg that loses packets, loss-based control (cubic, Linux's
	// default) keeps a few Mbit/s where bbr keeps most of the rate. Where
	// bbr cannot be had the host's default runs, and the relay says why and
	// what to do (metric hoplink_link_congestion_control_info, hoplink
	// status, the RelayNode's CongestionControl condition). Any other
	// name (bbr, cubic, reno, ...) pins that algorithm.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-z0-9_]+$`
	// +optional
	CongestionControl string `json:"congestionControl,omitempty"`
}

// LinkCongestionControl is what spec.links.congestionControl asks: auto
// when unset.
func (s *RelayNodeSpec) LinkCongestionControl() string {
	if s.Links == nil || s.Links.CongestionControl == "" {
		return CongestionControlAuto
	}
	return s.Links.CongestionControl
}

// RelaySidecar configures injected sidecar relays. Its presence, even
// empty (`sidecar: {}`), selects sidecar mode. Entry Tunnels of a sidecar
// relay listen on the pod's loopback unless their spec.listen.address says
// otherwise: a sidecar serves its own pod.
type RelaySidecar struct{}

// IsSidecar reports whether the RelayNode's relays are injected sidecars.
func (s *RelayNodeSpec) IsSidecar() bool { return s.Sidecar != nil }

// RelayNodeStatus is what the operator observed of a RelayNode.
type RelayNodeStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Desired is the number of nodes that should run this relay.
	// +optional
	Desired int32 `json:"desired"`
	// Ready is the number of relay pods that are ready.
	// +optional
	Ready int32 `json:"ready"`
	// Injected counts the pods carrying an injected sidecar relay (sidecar
	// mode only); Outdated those injected by another operator version,
	// which pick up the current one when they are recreated.
	// +optional
	Injected int32 `json:"injected,omitempty"`
	// +optional
	Outdated int32 `json:"outdated,omitempty"`
	// Endpoints peers use to reach this relay: spec.endpoints when set,
	// else the node (host network) or pod address of each ready relay pod.
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// CertificateNotAfter is when the relay's current certificate expires;
	// the operator renews it well before. For a sidecar RelayNode whose
	// pods have certificates of their own (pod certificates), when one
	// the signer issues now expires. The operator sets it only on a
	// RelayNode that holds its name, so relays trust a RelayNode of their
	// namespace as a peer only once this is set and while Ready is not
	// NameConflict.
	// +optional
	CertificateNotAfter *metav1.Time `json:"certificateNotAfter,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RelayNode is one relay of the hoplink network. Its name is the relay's
// identity in certificates and routes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rn,categories=hoplink
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Cert Expires",type=string,JSONPath=`.status.certificateNotAfter`
// +kubebuilder:printcolumn:name="Endpoints",type=string,JSONPath=`.status.endpoints`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label (lower-case letters, digits and '-', at most 63 characters): a relay's name is its certificate name"
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
