// Package metrics defines the Prometheus metrics every relay exports. Every
// series carries a relay label, so local mode, which runs all relays in one
// process, exports one registry that still tells them apart.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the relays of one process.
type Metrics struct {
	Bytes       *prometheus.CounterVec
	Flows       *prometheus.CounterVec
	ActiveFlows *prometheus.GaugeVec
	FlowSetup   *prometheus.HistogramVec
	FlowErrors  *prometheus.CounterVec
	Rejected    *prometheus.CounterVec
	PeerUp      *prometheus.GaugeVec
	// PeerFamily is 1 for the IP family the connection to a peer runs on
	// while it is up: with endpoints of both families, the one that
	// answered first.
	PeerFamily *prometheus.GaugeVec
	Ready      *prometheus.GaugeVec
	// TunnelOpen is 1 while a Tunnel's entry is open on its entry relay,
	// 0 while it cannot open (retried).
	TunnelOpen *prometheus.GaugeVec
	// CertExpiry is when the relay's certificate expires (Unix seconds).
	CertExpiry  *prometheus.GaugeVec
	Handshakes  *prometheus.CounterVec
	UDPSessions *prometheus.GaugeVec
	UDPDropped  *prometheus.CounterVec
	RateWaited  *prometheus.CounterVec
	// FairWaited is time flows waited for their Tunnel's fair share of a
	// link.
	FairWaited *prometheus.CounterVec
	// UDPFramed counts sessions that turned to stream mode (udp.mode auto).
	UDPFramed *prometheus.CounterVec
	// SendLost counts packets the host refused to send (a local firewall
	// drop, a full buffer), which QUIC recovers as losses.
	SendLost *prometheus.CounterVec
	// RedundantCopies counts lone QUIC packets sent a second time on
	// links that lose packets.
	RedundantCopies *prometheus.CounterVec
	// DatagramCopies counts UDP datagrams a relay's datagram channel sent
	// twice on a link that loses packets.
	DatagramCopies *prometheus.CounterVec
	// UDPBuffer is the size of the relay socket's buffers as the kernel
	// granted them.
	UDPBuffer *prometheus.GaugeVec
	// DrainNotices counts the connections on which a peer said it drains,
	// by whether that counted for the peer or for the connection alone.
	DrainNotices *prometheus.CounterVec
	// ConnsEvicted counts the connections a relay closed because their
	// peer held more than its bound.
	ConnsEvicted *prometheus.CounterVec
	// ReloadsRejected counts reloads a relay refused, keeping what it
	// ran: manifests, or certificate files.
	ReloadsRejected *prometheus.CounterVec

	// Link measurements, labelled from (this relay) and to (the peer).
	LinkUp       *prometheus.GaugeVec
	LinkRTT      *prometheus.GaugeVec
	LinkRTTMin   *prometheus.GaugeVec
	LinkSmoothed *prometheus.GaugeVec
	LinkJitter   *prometheus.GaugeVec
	LinkLoss     *prometheus.GaugeVec
	LinkProbes   *prometheus.CounterVec
	// LinkTransport is 1 for the transport a link's bulk flows take under
	// transport: auto, with the reason; LinkGoodput is what bulk flows
	// achieved per transport.
	LinkTransport *prometheus.GaugeVec
	LinkGoodput   *prometheus.GaugeVec
	// LinkCongestion is 1 for the TCP congestion control the relay's TLS
	// links run, with the reason.
	LinkCongestion *prometheus.GaugeVec
	// LinkFlows counts the flows a relay opened on a link of a transport:
	// auto chains' by the reason of each choice.
	LinkFlows *prometheus.CounterVec
	// TargetRTT is an exit relay's connect time to a Tunnel's target.
	TargetRTT *prometheus.GaugeVec
	TargetUp  *prometheus.GaugeVec
	// ChainRoute is 1 for the route a relay knows its chain to use.
	ChainRoute *prometheus.GaugeVec
	// Route is set by relays that route the chains they enter.
	Route *Route

	// TUN Tunnels: packets and bytes through the device (direction in is
	// from the device), drops by reason, flows by protocol.
	TUNPackets *prometheus.CounterVec
	TUNBytes   *prometheus.CounterVec
	TUNDropped *prometheus.CounterVec
	TUNFlows   *prometheus.CounterVec
}

// New creates the metrics and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tunnel_bytes_total",
			Help: "Payload bytes a relay moved for a tunnel; direction up is client to target, down is target to client.",
		}, []string{"relay", "tunnel", "direction"}),
		Flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tunnel_flows_total",
			Help: "Flows (TCP connections, UDP sessions) a relay started for a tunnel, by role: entry, middle or exit.",
		}, []string{"relay", "tunnel", "role"}),
		ActiveFlows: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_tunnel_active_flows",
			Help: "Flows a relay is carrying now, by tunnel and role.",
		}, []string{"relay", "tunnel", "role"}),
		FlowSetup: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hoplink_flow_setup_seconds",
			Help: "Time to set a flow up: at the entry, from accept to the header sent to the next hop; at the exit, to connect to the target.",
			Buckets: []float64{
				.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10,
			},
		}, []string{"relay", "tunnel", "role"}),
		FlowErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_flow_errors_total",
			Help: "Flows that ended in error, by reason (dial_target, egress_refused: a target the exit's egress policy refuses, next_hop, no_route, flow_limit, tunnel_limit, source_limit, draining, idle, evicted, stalled: a stuck write, a TCP flow's reset to let a new flow of its QUIC connection through, counted at each relay that reset it for its own connection; client_reset, prev_hop_reset, next_hop_reset, target_reset: a TCP flow reset, or a UDP session broken, by the end whose failure came first: a relay that dies mid-flow is a next_hop_reset before it on the route and a prev_hop_reset after it).",
		}, []string{"relay", "tunnel", "reason"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_rejected_streams_total",
			Help: "Streams from peers that a relay reset without forwarding, by reason (bad_header, header_limit: too many of the connection waiting for their header, links_limit: too many link requests at once, unknown_tunnel, unknown_chain, wrong_protocol, bad_route, bad_target, no_device: a packet Tunnel's exit device cannot open).",
		}, []string{"relay", "reason"}),
		ReloadsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_reloads_rejected_total",
			Help: "Reloads a relay refused, keeping what it ran, by what (manifests, certificates): the log says why.",
		}, []string{"relay", "what"}),
		Ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_relay_ready",
			Help: "1 while a relay runs and is ready (its tunnels open, its listener up), 0 once it stops.",
		}, []string{"relay"}),
		TunnelOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_tunnel_open",
			Help: "1 while a Tunnel's entry (listener or device) is open on its entry relay, 0 while it cannot open (the relay retries every 5 s).",
		}, []string{"relay", "tunnel"}),
		CertExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_certificate_expiry_seconds",
			Help: "When the certificate a relay presents expires, in Unix seconds: alert on hoplink_certificate_expiry_seconds - time() < 7 * 86400.",
		}, []string{"relay"}),
		PeerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_peer_up",
			Help: "1 while a relay holds an established QUIC connection to a peer it forwards to.",
		}, []string{"relay", "peer"}),
		PeerFamily: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_peer_family_info",
			Help: "1 for the IP family (ipv4, ipv6) a relay's connection to a peer it forwards to runs on, while it is up: with endpoints of both families, the one that answered first.",
		}, []string{"relay", "peer", "family"}),
		Handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_peer_handshakes_total",
			Help: "Handshakes with peers, QUIC and TLS alike, by direction (dial, accept) and result (ok, failed, rejected).",
		}, []string{"relay", "direction", "result"}),
		UDPSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_udp_sessions",
			Help: "Open UDP sessions by tunnel and role.",
		}, []string{"relay", "tunnel", "role"}),
		RateWaited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tunnel_rate_wait_seconds_total",
			Help: "Time a Tunnel's TCP flows waited at this relay for its rate limit (spec.limits.rateMbps), by direction: up at the entry (client to target), down at the exit. Growing about one second a second per busy flow: the Tunnel sends at its limit.",
		}, []string{"relay", "tunnel", "direction"}),
		FairWaited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tunnel_fair_share_wait_seconds_total",
			Help: "Time a Tunnel's TCP flows waited at this relay before writing to the peer (the next relay toward the target or toward the client), held to the Tunnel's fair share of that link while another Tunnel that wants more got less than its own. Growing: the Tunnel would take more than an even share of a contended link.",
		}, []string{"relay", "tunnel", "peer"}),
		UDPDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_udp_dropped_packets_total",
			Help: "UDP packets a relay dropped, by reason (session_limit, source_limit, queue_full, send_failed, write_failed, rate_limit: over the Tunnel's spec.limits.rateMbps, fair_share: over the Tunnel's fair share of a contended link to the next relay, while another Tunnel that wants more gets less than its own, setup_failed: held for a session that could not be set up; with an empty tunnel label, datagrams from peers: no_session for a session the relay does not know, bad_datagram, probe_limit for link probes past the echo rate; and datagrams a relay's datagram channel held back while pacing to a congested link: late when one waited longer than the link's round trip, queue_full past 4 MiB held).",
		}, []string{"relay", "tunnel", "reason"}),
		UDPFramed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_udp_framed_sessions_total",
			Help: "UDP sessions of udp.mode auto that turned to stream mode for their rate, by role (entry: client to target, exit: replies).",
		}, []string{"relay", "tunnel", "role"}),
		SendLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_send_lost_packets_total",
			Help: "QUIC packets the host refused to send, by reason (eperm: a local firewall or a full conntrack table; enobufs; eagain); QUIC recovers them as lost packets and the connection lives on.",
		}, []string{"relay", "reason"}),
		RedundantCopies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_quic_redundant_packets_total",
			Help: "Lone QUIC packets (not part of a GSO batch) sent a second time because the link to their destination lost at least 0.5% of packets; the receiver drops the copy it already has.",
		}, []string{"relay"}),
		DatagramCopies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_udp_datagram_copies_total",
			Help: "UDP datagrams sent a second time between relays because the link loses at least 0.1% of packets and has room for the copies (twice the datagrams sent stay below 80% of what the link last carried when congested); the receiver drops the copy it already has. The bandwidth that loss repair costs.",
		}, []string{"relay"}),
		UDPBuffer: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_udp_socket_buffer_bytes",
			Help: "Buffer of the relay's QUIC socket by direction (receive, send), as the kernel granted it (Linux reports twice what was set). quic-go asks for 7 MiB; unprivileged relays get at most net.core.rmem_max / wmem_max.",
		}, []string{"relay", "direction"}),
		DrainNotices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_peer_drain_notices_total",
			Help: "Connections on which a peer said it drains (or is done), by result: honoured (the peer takes no new flows: it said so on the relay's own link to it, or, while there is none, on a connection that carried its admitted flows) or ignored (only that connection stops taking flows).",
		}, []string{"relay", "peer", "result"}),
		ConnsEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_peer_connections_evicted_total",
			Help: "QUIC connections a peer dialed to a relay that the relay closed because the peer held more than its bound: the idlest first, never one carrying flows.",
		}, []string{"relay", "peer"}),
		LinkUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_up",
			Help: "1 when the last probe round on the link from one relay to another got an answer.",
		}, []string{"from", "to"}),
		LinkRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_rtt_seconds",
			Help: "Median round trip of the last probe round on a link between relays: the figure routes are chosen by.",
		}, []string{"from", "to"}),
		LinkRTTMin: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_rtt_min_seconds",
			Help: "Least probe round trip on a link over the recent rounds.",
		}, []string{"from", "to"}),
		LinkSmoothed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_rtt_smoothed_seconds",
			Help: "Smoothed RTT of the QUIC connection of a link, from QUIC's own statistics.",
		}, []string{"from", "to"}),
		LinkJitter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_jitter_seconds",
			Help: "Mean variation between successive probe round trips on a link.",
		}, []string{"from", "to"}),
		LinkLoss: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_loss_ratio",
			Help: "Share of probes lost on a link over the recent rounds.",
		}, []string{"from", "to"}),
		LinkProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_link_probes_total",
			Help: "Probes sent on a link, by result (answered, lost).",
		}, []string{"from", "to", "result"}),
		LinkTransport: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_transport_info",
			Help: "1 for the transport (quic, tls) bulk flows and packet sessions of transport: auto chains take on a link, with the reason it was chosen (unmeasured, measured).",
		}, []string{"from", "to", "transport", "reason"}),
		LinkCongestion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_congestion_control_info",
			Help: "1 for the TCP congestion control (bbr, cubic, ...) every TLS link of the relay (from) runs, dialed and accepted, with the reason: auto (bbr, chosen), pinned (spec.links.congestionControl), not_allowed or not_available (the host's default runs instead of what was asked; the relay's log says what to do), unsupported.",
		}, []string{"from", "algorithm", "reason"}),
		LinkFlows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_link_flows_total",
			Help: "TCP flows (and UDP sessions at their entry) a relay opened toward the next relay, by transport and the reason it was taken (explicit: the chain names it; short_flows, interactive, long_interactive, unmeasured, measured, sampling, no_spare, tls_share, datagrams under auto).",
		}, []string{"from", "to", "transport", "reason"}),
		LinkGoodput: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_link_goodput_bits_per_second",
			Help: "Moving average of what bulk flows (1 MiB or more) achieved on a link per transport, while they moved.",
		}, []string{"from", "to", "transport"}),
		TargetRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_target_rtt_seconds",
			Help: "An exit relay's last TCP connect time to a Tunnel's target.",
		}, []string{"relay", "tunnel", "target"}),
		TargetUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_target_up",
			Help: "1 when an exit relay's last connect to a Tunnel's target succeeded.",
		}, []string{"relay", "tunnel", "target"}),
		ChainRoute: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_chain_route_info",
			Help: "1 for the route (relays joined by commas) a relay knows a chain's new flows to take.",
		}, []string{"relay", "chain", "route"}),
		TUNPackets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tun_packets_total",
			Help: "Packets through a tun Tunnel's device; direction in is read from the device, out written to it. With offload a packet may be a 64 KiB super-packet.",
		}, []string{"relay", "tunnel", "direction"}),
		TUNBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tun_bytes_total",
			Help: "Bytes through a tun Tunnel's device, by direction.",
		}, []string{"relay", "tunnel", "direction"}),
		TUNDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tun_dropped_packets_total",
			Help: "Packets a tun Tunnel dropped, by reason (not_ip, not_routed, not_source, no_session, session_limit, send_failed, queue_full, write_failed, malformed, unsupported_gso, device_gone, egress_refused: a packet to the exit's own node; echo_limit: a ping past a Tunnel's echo sessions, no_icmp_socket: an exit that may open no ICMP socket, so its pings go unanswered).",
		}, []string{"relay", "tunnel", "reason"}),
		TUNFlows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_tun_flows_total",
			Help: "Flows a tun Tunnel's stack terminated (flow mode), by protocol; icmp counts echo sessions, one per (source, destination, identifier) of the pings carried to the exit.",
		}, []string{"relay", "tunnel", "protocol"}),
	}
	reg.MustRegister(m.Bytes, m.Flows, m.ActiveFlows, m.FlowSetup, m.FlowErrors, m.Rejected,
		m.Ready, m.CertExpiry, m.TunnelOpen, m.PeerUp, m.PeerFamily, m.Handshakes, m.UDPSessions, m.UDPDropped, m.RateWaited, m.FairWaited, m.UDPFramed, m.SendLost, m.RedundantCopies, m.DatagramCopies, m.UDPBuffer, m.DrainNotices, m.ConnsEvicted, m.ReloadsRejected,
		m.LinkUp, m.LinkRTT, m.LinkRTTMin, m.LinkSmoothed, m.LinkJitter, m.LinkLoss, m.LinkProbes, m.LinkTransport, m.LinkGoodput, m.LinkCongestion, m.LinkFlows,
		m.TargetRTT, m.TargetUp, m.ChainRoute, m.TUNPackets, m.TUNBytes, m.TUNDropped, m.TUNFlows)
	m.Route = NewRoute(reg)
	return m
}

// Route are the metrics of a route controller: an entry relay routing its
// chains (standalone and local mode) or the operator.
type Route struct {
	Latency *prometheus.GaugeVec
	Changes *prometheus.CounterVec
	Rounds  *prometheus.CounterVec
}

// NewRoute creates the route controller metrics and registers them with reg.
func NewRoute(reg prometheus.Registerer) *Route {
	m := &Route{
		Latency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_chain_latency_seconds",
			Help: "Round trip of a chain's route: estimated (sum of link round trips plus the exit's to the target) or measured (a probe through the relays, plus the exit's round trip to the target).",
		}, []string{"chain", "kind"}),
		Changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_chain_route_changes_total",
			Help: "Times the route controller changed a chain's route.",
		}, []string{"chain"}),
		Rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_chain_route_rounds_total",
			Help: "Measurement rounds of a chain, by result: decided, or failed when no route could be measured.",
		}, []string{"chain", "result"}),
	}
	reg.MustRegister(m.Latency, m.Changes, m.Rounds)
	return m
}
