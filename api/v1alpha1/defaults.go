package v1alpha1

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
		c.Spec.Transport = TransportQUIC
	}
}

// Default fills the fields a user may leave out, as the CRD defaults do.
func (t *Tunnel) Default() {
	if t.Spec.Protocol == "" {
		t.Spec.Protocol = ProtocolTCP
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
	}
}
