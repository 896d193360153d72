// Package srcaddr says which client addresses count as one source for the
// limits a relay keeps per source host: an IPv4 address, or an IPv6 /64.
// One IPv6 host usually holds a whole /64 (SLAAC, privacy addresses, a
// container's subnet), so keying on the full address would let it take a
// fresh source for every connection.
package srcaddr

import (
	"net"
	"net/netip"
)

// IPv6Bits is the prefix length that groups IPv6 sources.
const IPv6Bits = 64

// Key is the source that a counts under: a's /32 (IPv4, or IPv4-mapped
// IPv6) or /64 (IPv6). The zero Addr gives the zero Prefix.
func Key(a netip.Addr) netip.Prefix {
	if !a.IsValid() {
		return netip.Prefix{}
	}
	a = a.Unmap().WithZone("")
	bits := 32
	if a.Is6() {
		bits = IPv6Bits
	}
	p, _ := a.Prefix(bits)
	return p
}

// Of is the source of a connection's remote address (a *net.TCPAddr or
// *net.UDPAddr; anything else, such as a pipe, is the zero Prefix).
func Of(a net.Addr) netip.Prefix {
	switch t := a.(type) {
	case *net.TCPAddr:
		return Key(t.AddrPort().Addr())
	case *net.UDPAddr:
		return Key(t.AddrPort().Addr())
	}
	return netip.Prefix{}
}
