package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// TestCRDValidationRejectsBadSpecs checks the message a user sees from
// `kubectl apply` for each bad spec the CRDs' OpenAPI and CEL rules catch.
func TestCRDValidationRejectsBadSpecs(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		obj    func() client.Object
		expect string
	}{
		{"static route missing", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Route = nil
			return c
		}, "spec.route is required when spec.mode is static"},
		{"route does not start at entry", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Route = []string{"la"}
			return c
		}, "spec.route must start at spec.entry"},
		{"route does not end at exit", func() client.Object {
			c := chain(ns, "a", "hk", "sea", "la")
			c.Spec.Route = []string{"hk", "sea"}
			return c
		}, "spec.route must end at spec.exit"},
		{"route through a relay not in via", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Route = []string{"hk", "tokyo", "la"}
			return c
		}, "spec.route may name only spec.entry, spec.exit and relays listed in spec.via"},
		{"relay twice", func() client.Object {
			c := chain(ns, "a", "hk", "sea", "la")
			c.Spec.Route = []string{"hk", "sea", "hk", "la"}
			return c
		}, "spec.route names a relay more than once"},
		{"bad mode", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Mode = "fastest"
			return c
		}, `spec.mode: Unsupported value: "fastest"`},
		{"bad relay name", func() client.Object { return chain(ns, "a", "HK", "la") }, "spec.entry: Invalid value"},
		{"sum route longer than maxHops", func() client.Object {
			c := chain(ns, "a", "hk", "sea", "la")
			c.Spec.Mode, c.Spec.MaxHops = v1alpha1.ModeSum, 1
			return c
		}, "spec.route has more links than spec.maxHops allows"},
		{"maxHops out of range", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.MaxHops = 16
			return c
		}, "spec.maxHops: Invalid value: 16"},
		{"probe interval too short", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Probe = &v1alpha1.ProbeSpec{Interval: &metav1.Duration{Duration: 10 * time.Millisecond}}
			return c
		}, "spec.probe.interval must be between 100ms and 10m"},
		{"too many pipe candidates", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			c.Spec.Probe = &v1alpha1.ProbeSpec{Candidates: 20}
			return c
		}, "spec.probe.candidates: Invalid value: 20"},
		{"hysteresis percent", func() client.Object {
			c := chain(ns, "a", "hk", "la")
			p := int32(150)
			c.Spec.Hysteresis = &v1alpha1.HysteresisSpec{Percent: &p}
			return c
		}, "spec.hysteresis.percent: Invalid value: 150"},
		{"tunnel port out of range", func() client.Object { return tunnel(ns, "t", "c", 70000) }, "spec.listen.port: Invalid value: 70000"},
		{"tunnel protocol", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.Protocol = "sctp"
			return tn
		}, `spec.protocol: Unsupported value: "sctp"`},
		{"tunnel target not host:port", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.Target = "http://web"
			return tn
		}, "spec.target: Invalid value"},
		{"udp options on tcp", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.UDP = &v1alpha1.UDPOptions{MaxSessions: 5}
			return tn
		}, "spec.udp applies only to protocol udp"},
		{"tcp options on udp", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.Protocol = v1alpha1.ProtocolUDP
			tn.Spec.TCP = &v1alpha1.TCPOptions{IdleTimeoutSeconds: 30}
			return tn
		}, "spec.tcp applies only to protocol tcp"},
		{"tcp idle timeout over a week", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.TCP = &v1alpha1.TCPOptions{IdleTimeoutSeconds: 604801}
			return tn
		}, "spec.tcp.idleTimeoutSeconds"},
		{"tun without its section", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN = nil
			return tn
		}, "spec.tun is required for protocol tun"},
		{"tun with listen and target", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.Listen, tn.Spec.Target = &v1alpha1.TunnelListen{Port: 80}, "web:80"
			return tn
		}, "protocol tun takes no spec.listen or spec.target"},
		{"tun section on tcp", func() client.Object {
			tn := tunnel(ns, "t", "c", 80)
			tn.Spec.TUN = tunTunnel(ns, "x", "c", v1alpha1.TunFlow).Spec.TUN
			return tn
		}, "spec.tun is required for protocol tun, and applies to it only"},
		{"tun address without prefix", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Address = "10.200.0.1"
			return tn
		}, "spec.tun.address must be an address with its prefix"},
		{"tun route not a prefix", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Routes = []string{"10.77.0.0/16", "east"}
			return tn
		}, "spec.tun.routes must be prefixes"},
		{"tun without routes", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Routes = nil
			return tn
		}, "spec.tun.routes: Required value"},
		{"tun mtu too small", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.MTU = 576
			return tn
		}, "spec.tun.mtu: Invalid value: 576"},
		{"tun IPv6 device below 1280", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Address, tn.Spec.TUN.Routes, tn.Spec.TUN.MTU = "fd20::1/64", []string{"fd77::/64"}, 1279
			return tn
		}, "spec.tun.mtu: Invalid value: 1279"},
		{"tun IPv4-mapped route", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Routes = []string{"fd77::/64", "::ffff:10.77.0.0/112"}
			return tn
		}, "spec.tun.routes must be prefixes"},
		{"tun IPv6 exit address without prefix", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunPacket)
			tn.Spec.TUN.Address, tn.Spec.TUN.Routes, tn.Spec.TUN.ExitAddress = "fd20::1/64", []string{"fd77::/64"}, "fd20::2"
			return tn
		}, "spec.tun.exitAddress must be an address with its prefix"},
		{"tun device name too long", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Name = "a-very-long-device"
			return tn
		}, "spec.tun.name: Too long"},
		{"tun mode", func() client.Object {
			tn := tunTunnel(ns, "t", "c", "bridge")
			return tn
		}, `spec.tun.mode: Unsupported value: "bridge"`},
		{"exitAddress in flow mode", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.ExitAddress = "10.200.0.2/24"
			return tn
		}, "spec.tun.exitAddress applies only to mode packet"},
		{"sources in flow mode", func() client.Object {
			tn := tunTunnel(ns, "t", "c", v1alpha1.TunFlow)
			tn.Spec.TUN.Sources = []string{"10.200.0.0/24"}
			return tn
		}, "spec.tun.sources applies only to mode packet"},
		{"relay port out of range", func() client.Object {
			return relayNode(ns, "hk", func(r *v1alpha1.RelayNode) { r.Spec.Listen.Port = 65535 })
		}, "spec.listen.port: Invalid value: 65535"},
		{"sidecar and external", func() client.Object {
			return sidecarRelay(ns, "sc", func(rn *v1alpha1.RelayNode) { rn.Spec.External, rn.Spec.Endpoints = true, []string{"a:1"} })
		}, "spec.sidecar and spec.external exclude each other"},
		{"sidecar on host network", func() client.Object {
			return sidecarRelay(ns, "sc", func(rn *v1alpha1.RelayNode) { rn.Spec.HostNetwork = ptr.To(true) })
		}, "spec.hostNetwork cannot be true with spec.sidecar"},
		{"sidecar with a node selector", func() client.Object {
			return sidecarRelay(ns, "sc", func(rn *v1alpha1.RelayNode) { rn.Spec.NodeSelector = map[string]string{"a": "b"} })
		}, "spec.nodeSelector and spec.tolerations do not apply with spec.sidecar"},
		{"sidecar with endpoints", func() client.Object {
			return sidecarRelay(ns, "sc", func(rn *v1alpha1.RelayNode) { rn.Spec.Endpoints = []string{"a:1"} })
		}, "spec.endpoints cannot be set with spec.sidecar"},
		{"external relay without endpoints", func() client.Object {
			return relayNode(ns, "hk", func(r *v1alpha1.RelayNode) { r.Spec.External = true })
		}, "spec.endpoints is required when spec.external is true"},
		{"relay endpoint not host:port", func() client.Object {
			return relayNode(ns, "hk", func(r *v1alpha1.RelayNode) { r.Spec.Endpoints = []string{"relay.example"} })
		}, "spec.endpoints[0]: Invalid value"},
		{"relay name not a DNS label", func() client.Object { return relayNode(ns, "hk.east") }, "metadata.name must be a DNS label"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := k8s.Create(ctx, tc.obj())
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tc.expect)
			}
			if !strings.Contains(err.Error(), tc.expect) {
				t.Fatalf("error %q\nwant it to contain %q", err, tc.expect)
			}
		})
	}
	// And what the rules must let through: IPv6 alone at its least MTU,
	// and both families on one device.
	six := tunTunnel(ns, "six", "c", v1alpha1.TunFlow)
	six.Spec.TUN.Address, six.Spec.TUN.Routes, six.Spec.TUN.MTU = "fd20::1/64", []string{"fd77::/64", "2001:db8::/32"}, 1280
	dual := tunTunnel(ns, "dual", "c", v1alpha1.TunPacket)
	dual.Spec.TUN.Routes, dual.Spec.TUN.Sources = []string{"10.77.0.0/16", "fd77::/64"}, []string{"10.200.0.0/24", "fd30::/64"}
	for _, tn := range []*v1alpha1.Tunnel{six, dual} {
		if err := k8s.Create(ctx, tn); err != nil {
			t.Errorf("Tunnel %s refused: %v", tn.Name, err)
		}
	}
}

func TestCRDImmutableFields(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	ctx := context.Background()
	c := chain(ns, "fixed", "hk", "la")
	create(t, c)
	waitReason(t, c, "RelayNotFound") // the operator has written status; c is current
	c.Spec.Entry, c.Spec.Route = "sea", []string{"sea", "la"}
	if err := k8s.Update(ctx, c); err == nil || !strings.Contains(err.Error(), "spec.entry is immutable") {
		t.Errorf("changing spec.entry: %v", err)
	}
	tn := tunnel(ns, "fixed", "fixed", 8080)
	create(t, tn)
	waitReason(t, tn, "ChainNotReady")
	tn.Spec.Protocol = v1alpha1.ProtocolUDP
	if err := k8s.Update(ctx, tn); err == nil || !strings.Contains(err.Error(), "spec.protocol is immutable") {
		t.Errorf("changing spec.protocol: %v", err)
	}
}
