package tun

// Stats receives what a tun Tunnel's device, and a stack on it, count; the
// relay turns it into metrics. Any field may be nil.
type Stats struct {
	In, Out func(packets, bytes int) // packets read from the device, or written to it
	Drop    func(reason string)      // a packet dropped
	Flow    func(protocol string)    // a flow a stack terminated (tcp, udp), a ping answered (icmp)
}

// Dropped counts a packet dropped for reason.
func (s *Stats) Dropped(reason string) {
	if s != nil && s.Drop != nil {
		s.Drop(reason)
	}
}

// Flowed counts a flow of protocol.
func (s *Stats) Flowed(protocol string) {
	if s != nil && s.Flow != nil {
		s.Flow(protocol)
	}
}

// Read counts packets read from the device.
func (s *Stats) Read(packets, bytes int) {
	if s != nil && s.In != nil {
		s.In(packets, bytes)
	}
}

// Wrote counts packets written to the device.
func (s *Stats) Wrote(packets, bytes int) {
	if s != nil && s.Out != nil {
		s.Out(packets, bytes)
	}
}
