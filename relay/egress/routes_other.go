//go:build !linux

package egress

import "net/netip"

// CheckRoutes: TUN devices are Linux only.
func (p *Policy) CheckRoutes([]netip.Prefix) error { return nil }
