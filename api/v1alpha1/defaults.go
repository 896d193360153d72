package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Default fills the fields a user may leave out, as the CRD defaults do.
func (r *RelayNode) Default() {
	if r.Spec.Listen.Port == 0 {
		r.Spec.Listen.Port = DefaultRelayPort
	}
}

// Default fills the fields a user may leave out, as the CRD defaults do.
func (c *Chain) Default() {
	if c.Spec.Mode == "" {
		c.Spec.Mode = ModeStatic
	}
	if c.Spec.Transport == "" {
		c.Spec.Transport = TransportAuto
	}
	if c.Spec.MaxHops == 0 {
		c.Spec.MaxHops = DefaultMaxHops
	}
	if c.Spec.Probe == nil {
		c.Spec.Probe = &ProbeSpec{}
	}
	if c.Spec.Probe.Interval == nil {
		c.Spec.Probe.Interval = &metav1.Duration{Duration: DefaultProbeInterval}
	}
	if c.Spec.Probe.Candidates == 0 {
		c.Spec.Probe.Candidates = DefaultProbeCandidates
	}
	if c.Spec.Hysteresis == nil {
		c.Spec.Hysteresis = &HysteresisSpec{}
	}
	h := c.Spec.Hysteresis
	if h.Percent == nil {
		p := int32(DefaultHysteresisPercent)
		h.Percent = &p
	}
	if h.Min == nil {
		h.Min = &metav1.Duration{Duration: DefaultHysteresisMin}
	}
	if h.Rounds == 0 {
		h.Rounds = DefaultHysteresisRounds
	}
}

// Default fills the fields a user may leave out, as the CRD defaults do.
func (t *Tunnel) Default() {
	if t.Spec.Protocol == "" {
		t.Spec.Protocol = ProtocolTCP
	}
	if u := t.Spec.TUN; t.Spec.Protocol == ProtocolTUN && u != nil {
		if u.Mode == "" {
			u.Mode = TunFlow
		}
		if u.MTU == 0 {
			u.MTU = DefaultTunMTU
		}
		if u.Name == "" {
			u.Name = TunDeviceName(t.Name)
		}
	}
	if t.Spec.TCP != nil && t.Spec.TCP.IdleTimeoutSeconds == 0 {
		t.Spec.TCP.IdleTimeoutSeconds = DefaultTCPIdleTimeout
	}
	if t.Spec.Protocol == ProtocolUDP {
		if t.Spec.UDP == nil {
			t.Spec.UDP = &UDPOptions{}
		}
		if t.Spec.UDP.IdleTimeoutSeconds == 0 {
			t.Spec.UDP.IdleTimeoutSeconds = DefaultUDPIdleTimeout
		}
		if t.Spec.UDP.MaxSessions == 0 {
			t.Spec.UDP.MaxSessions = DefaultUDPMaxSessions
		}
		if t.Spec.UDP.Mode == "" {
			t.Spec.UDP.Mode = UDPAuto
		}
	}
}

// TunDeviceName is the default device name of a tun Tunnel: hl- and as much
// of the Tunnel's name as fits the 15 bytes of a Linux interface name.
func TunDeviceName(tunnel string) string {
	name := "hl-" + tunnel
	if len(name) > 15 {
		name = name[:15]
	}
	return name
}
