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
	PeerRTT     *prometheus.GaugeVec
	Handshakes  *prometheus.CounterVec
	UDPSessions *prometheus.GaugeVec
	UDPDropped  *prometheus.CounterVec
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
			Help: "Flows that ended in error, by reason (dial_target, next_hop, reset, flow_limit).",
		}, []string{"relay", "tunnel", "reason"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_rejected_streams_total",
			Help: "Streams from peers that a relay reset without forwarding, by reason (bad_header, unknown_tunnel, bad_route, bad_target, wrong_protocol).",
		}, []string{"relay", "reason"}),
		PeerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_peer_up",
			Help: "1 while a relay holds an established QUIC connection to a peer it forwards to.",
		}, []string{"relay", "peer"}),
		PeerRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_peer_rtt_seconds",
			Help: "Smoothed RTT of the QUIC connection to a peer.",
		}, []string{"relay", "peer"}),
		Handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_peer_handshakes_total",
			Help: "QUIC handshakes with peers by direction (dial, accept) and result (ok, failed, rejected).",
		}, []string{"relay", "direction", "result"}),
		UDPSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hoplink_udp_sessions",
			Help: "Open UDP sessions by tunnel and role.",
		}, []string{"relay", "tunnel", "role"}),
		UDPDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hoplink_udp_dropped_packets_total",
			Help: "UDP packets a relay dropped, by reason (session_limit, queue_full, too_large, no_session).",
		}, []string{"relay", "tunnel", "reason"}),
	}
	reg.MustRegister(m.Bytes, m.Flows, m.ActiveFlows, m.FlowSetup, m.FlowErrors, m.Rejected,
		m.PeerUp, m.PeerRTT, m.Handshakes, m.UDPSessions, m.UDPDropped)
	return m
}
