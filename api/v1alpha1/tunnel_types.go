package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Protocol is what a Tunnel carries.
// +kubebuilder:validation:Enum=tcp;udp;tun
type Protocol string

const (
	// ProtocolTCP forwards TCP connections, one QUIC stream each.
	ProtocolTCP Protocol = "tcp"
	// ProtocolUDP forwards UDP datagrams, one session per client address.
	ProtocolUDP Protocol = "udp"
	// ProtocolTUN carries whole subnets: a TUN device on the entry relay,
	// whose routes say what the Tunnel reaches.
	ProtocolTUN Protocol = "tun"
)

// TunMode says how a tun Tunnel carries what enters its device.
// +kubebuilder:validation:Enum=flow;packet
type TunMode string

const (
	// TunFlow terminates each TCP and UDP flow in a userspace TCP/IP stack
	// on the entry relay and carries it as an ordinary flow; the exit dials
	// the flow's destination and needs no privileges.
	TunFlow TunMode = "flow"
	// TunPacket carries the IP packets themselves to the exit relay, which
	// writes them to a TUN device of its own: site to site.
	TunPacket TunMode = "packet"
)

// Defaults of a tun Tunnel.
const (
	DefaultTunMTU = 1420
)

// TunOptions configure a tun Tunnel's device.
//
// +kubebuilder:validation:XValidation:rule="!has(self.exitAddress) || (has(self.mode) && self.mode == 'packet')",message="spec.tun.exitAddress applies only to mode packet"
// +kubebuilder:validation:XValidation:rule="!has(self.sources) || (has(self.mode) && self.mode == 'packet')",message="spec.tun.sources applies only to mode packet"
type TunOptions struct {
	// Name of the device on the entry relay (and on the exit, in packet
	// mode). Default: hl- and the start of the Tunnel's name.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`
	// +optional
	Name string `json:"name,omitempty"`
	// Address is the entry relay's address on the device with its prefix,
	// e.g. 10.200.0.1/24 or fd20::1/64.
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="spec.tun.address must be an address with its prefix, such as 10.200.0.1/24"
	Address string `json:"address"`
	// MTU of the device: at least 1280, the least IPv6 allows on a link.
	// +kubebuilder:validation:Minimum=1280
	// +kubebuilder:validation:Maximum=9000
	// +kubebuilder:default=1420
	// +optional
	MTU int32 `json:"mtu,omitempty"`
	// Routes are the destination prefixes sent into the device, and the
	// only destinations the exit relay reaches for this Tunnel: IPv4, IPv6
	// or both. The other family than Address's leaves the entry host from
	// its own address of that family.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(r, isCIDR(r))",message="spec.tun.routes must be prefixes, such as 10.77.0.0/16"
	Routes []string `json:"routes"`
	// Mode is flow (default) or packet.
	// +kubebuilder:default=flow
	// +optional
	Mode TunMode `json:"mode,omitempty"`
	// ExitAddress is, in packet mode, the exit relay's address on its own
	// device, with its prefix. Default: the entry's address plus one.
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="spec.tun.exitAddress must be an address with its prefix, such as 10.200.0.2/24"
	// +optional
	ExitAddress string `json:"exitAddress,omitempty"`
	// Sources are, in packet mode, the prefixes on the entry's side: the
	// exit accepts packets from them only and routes replies to them back
	// into its device. Default: the prefix of Address. A device carrying
	// both families lists the entry host's network of the other family
	// too, e.g. [10.200.0.0/24, "fd30::/64"].
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(r, isCIDR(r))",message="spec.tun.sources must be prefixes, such as 10.200.0.0/24"
	// +optional
	Sources []string `json:"sources,omitempty"`
}

// Defaults for UDP sessions.
const (
	DefaultUDPIdleTimeout = 60 // seconds
	DefaultUDPMaxSessions = 4096
)

// DefaultTCPIdleTimeout ends a TCP flow after an hour without a byte either
// way (seconds).
const DefaultTCPIdleTimeout = 3600

// TunnelListen is the address a Tunnel opens on its chain's entry relay.
type TunnelListen struct {
	// Address to bind on the entry relay; empty binds every address, which
	// on a host-network relay is every address of its node, and on a
	// sidecar relay both loopbacks of its pod (127.0.0.1 and ::1).
	// +optional
	Address string `json:"address,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
	// AllowedSources are the client networks (CIDRs, such as 10.0.0.0/8 or
	// 2001:db8::/32) the entry takes connections (tcp) and datagrams (udp)
	// from; a connection from elsewhere is closed at once, a datagram
	// dropped, and both counted. Empty takes every source. Clients are
	// seen as the relay sees them: behind a NAT or a Service that
	// rewrites sources, that is the rewritten address.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self.all(c, isCIDR(c))",message="spec.listen.allowedSources: each entry must be a CIDR such as 10.0.0.0/8 or 2001:db8::/32"
	// +listType=set
	// +optional
	AllowedSources []string `json:"allowedSources,omitempty"`
}

// TCPOptions tune TCP flows.
type TCPOptions struct {
	// IdleTimeoutSeconds resets a flow after this long without a byte in
	// either direction, at every relay it crosses, so that idle connections
	// do not hold the relays' flows for ever.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	// +kubebuilder:default=3600
	// +optional
	IdleTimeoutSeconds int32 `json:"idleTimeoutSeconds,omitempty"`
}

// UDPOptions tune UDP session handling.
type UDPOptions struct {
	// IdleTimeoutSeconds closes a session after this long without traffic in
	// either direction.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=60
	// +optional
	IdleTimeoutSeconds int32 `json:"idleTimeoutSeconds,omitempty"`
	// MaxSessions bounds the Tunnel's sessions at its entry relay, where a
	// new client beyond it is dropped (and counted) until a session ends,
	// and at its exit, where it bounds the sessions of all entries
	// together: one past it waits up to a second for a place, then is
	// refused (and counted).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=4096
	// +optional
	MaxSessions int32 `json:"maxSessions,omitempty"`
	// Mode says how a session's datagrams cross the relays: datagram
	// (datagrams between relays, at the rate the sender sends, paced only
	// when a link congests: unreliable and unordered like UDP itself, best
	// for real-time traffic and for tunnels of congestion-controlled
	// protocols),
	// stream (framed on a reliable stream: nothing dropped between relays,
	// for bulk; on a chain with transport auto it rides the link's bulk
	// transport, TLS until measured otherwise), or auto: datagrams until a
	// session sends more than 16,000 a second, stream from then on; on a
	// chain with transport auto the Tunnel's sessions of the next 10
	// minutes then start as stream.
	// +kubebuilder:default=auto
	// +optional
	Mode UDPMode `json:"mode,omitempty"`
}

// UDPMode is how a UDP session's datagrams cross the relays.
// +kubebuilder:validation:Enum=auto;datagram;stream
type UDPMode string

const (
	UDPAuto     UDPMode = "auto"
	UDPDatagram UDPMode = "datagram"
	UDPStream   UDPMode = "stream"
)

// TunnelSpec is one forwarded service: a listener on the chain's entry relay
// and the target its exit relay dials; or, for protocol tun, a device on
// the entry relay and the prefixes routed into it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.udp) || (has(self.protocol) && self.protocol == 'udp')",message="spec.udp applies only to protocol udp: remove it or set spec.protocol: udp"
// +kubebuilder:validation:XValidation:rule="!has(self.tcp) || !has(self.protocol) || self.protocol == 'tcp'",message="spec.tcp applies only to protocol tcp: remove it or set spec.protocol: tcp"
// +kubebuilder:validation:XValidation:rule="(has(self.protocol) && self.protocol == 'tun') == has(self.tun)",message="spec.tun is required for protocol tun, and applies to it only"
// +kubebuilder:validation:XValidation:rule="(has(self.protocol) && self.protocol == 'tun') || (has(self.listen) && has(self.target))",message="spec.listen and spec.target are required for protocol tcp and udp"
// +kubebuilder:validation:XValidation:rule="!(has(self.protocol) && self.protocol == 'tun') || (!has(self.listen) && !has(self.target))",message="protocol tun takes no spec.listen or spec.target: spec.tun.routes say what it reaches"
// +kubebuilder:validation:XValidation:rule="!has(self.proxyProtocol) || !has(self.protocol) || self.protocol == 'tcp' || (self.protocol == 'udp' && self.proxyProtocol == 'v2')",message="spec.proxyProtocol: protocol udp takes only v2 (v1 is text for TCP), and protocol tun none"
// +kubebuilder:validation:XValidation:rule="!has(self.limits) || !has(self.protocol) || self.protocol != 'tun'",message="spec.limits applies to protocol tcp and udp only; remove it from a tun Tunnel"
type TunnelSpec struct {
	// Chain is the name of the Chain this Tunnel's flows travel.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Chain string `json:"chain"`
	// Protocol is tcp (the default), udp, or tun (a whole subnet through a
	// device; see spec.tun).
	// +kubebuilder:default=tcp
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.protocol is immutable: create a new Tunnel for another protocol"
	// +optional
	Protocol Protocol `json:"protocol,omitempty"`
	// Listen is opened on the chain's entry relay (tcp and udp).
	// +optional
	Listen *TunnelListen `json:"listen,omitempty"`
	// Target is the host:port the exit relay dials (tcp and udp). It is the
	// only destination this Tunnel can reach.
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$`
	// +optional
	Target string `json:"target,omitempty"`
	// TCP tunes TCP flows (protocol tcp only; refused on others).
	// +optional
	TCP *TCPOptions `json:"tcp,omitempty"`
	// UDP tunes UDP sessions (protocol udp only; refused on others).
	// +optional
	UDP *UDPOptions `json:"udp,omitempty"`
	// TUN is the device of a tun Tunnel.
	// +optional
	TUN *TunOptions `json:"tun,omitempty"`
	// ProxyProtocol makes the exit tell the target each client's address
	// with a PROXY protocol header: v1 (text, tcp) or v2 (binary, tcp and
	// udp, where it starts every datagram). The target must expect it.
	// Every relay of the chain must run a version that knows this field.
	// +kubebuilder:validation:Enum=v1;v2
	// +optional
	ProxyProtocol ProxyProtocol `json:"proxyProtocol,omitempty"`
	// Limits hold the Tunnel to what it may take of the relays it crosses
	// (protocol tcp and udp). A namespace labelled
	// limits.hoplink.dev/max-rate-mbps=N, limits.hoplink.dev/max-flows=N
	// or limits.hoplink.dev/max-weight=N takes only Tunnels that set
	// rateMbps or maxFlows (weight: if set) to N or less; one labelled
	// limits.hoplink.dev/default-rate-mbps=N or
	// limits.hoplink.dev/default-max-flows=N fills the field a Tunnel
	// leaves out (the chart's admission policies, value
	// tunnelLimits.policy; defaults from Kubernetes 1.36). The Limited
	// condition says when a relay held the Tunnel to a limit, and which.
	// +optional
	Limits *TunnelLimits `json:"limits,omitempty"`
}

// TunnelLimits hold one Tunnel to a share of the relays, whatever other
// Tunnels do.
type TunnelLimits struct {
	// RateMbps bounds the Tunnel's payload in each direction, all its
	// flows and sessions together, in megabits a second: client to target
	// at the entry relay, target to client at the exit. TCP flows wait for
	// their turn (the sender slows down); UDP datagrams over the rate are
	// dropped and counted (udp_dropped_packets_total, reason rate_limit).
	// Each entry and exit relay holds the rate on its own: a Tunnel whose
	// entry runs as several replicas may take the rate at each.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +optional
	RateMbps int32 `json:"rateMbps,omitempty"`
	// MaxFlows bounds the Tunnel's flows (TCP connections and UDP
	// sessions) each relay of its chain carries at once, below the relay's
	// own share for one Tunnel (--max-flows-per-tunnel). Past it a new flow
	// is refused (flow_errors_total, reason tunnel_limit) and the others
	// keep theirs.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	MaxFlows int32 `json:"maxFlows,omitempty"`
	// Weight is the Tunnel's share of a link that Tunnels contend for,
	// against the other Tunnels on it: where the link between two relays
	// is full, each Tunnel that wants more than it gets is given a share
	// in proportion to its weight (3 beside 1: three quarters), whatever
	// its number of flows or sessions, and what a Tunnel leaves unused the
	// others take. A Tunnel alone on a link gets all of it. Default 1; the
	// chart lets a namespace take more only where an admin labels it
	// limits.hoplink.dev/max-weight (or raises tunnelLimits.maxWeight).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Weight int32 `json:"weight,omitempty"`
}

// ProxyProtocol is a version of the PROXY protocol.
type ProxyProtocol string

const (
	ProxyV1 ProxyProtocol = "v1"
	ProxyV2 ProxyProtocol = "v2"
)

// TunnelStatus says where clients connect and whether the Tunnel works.
type TunnelStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Address clients in the cluster use: the Tunnel's Service,
	// NAME.NAMESPACE.svc:PORT; in the pods of a sidecar entry, its listen
	// address, localhost:PORT for both loopbacks.
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
// +kubebuilder:printcolumn:name="Listen",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.target`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
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
