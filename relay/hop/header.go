// Package hop is the wire format a relay puts in front of every flow it
// sends to the next relay: which Tunnel the flow belongs to, the route that
// remains, and the target the exit relay dials. Each relay parses it, checks
// it against the manifests it knows, and writes a shorter one for the next
// hop. The parser is strict (no trailing bytes, bounded lengths, restricted
// alphabets) because a peer with a valid certificate can still send anything.
package hop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Version is the header version this relay writes and reads.
const Version = 1

// Kind is what the stream carries.
type Kind uint8

const (
	// KindTCP: the stream is the byte stream of one TCP connection.
	KindTCP Kind = 1
	// KindUDP: the stream controls one UDP session; datagrams carry its
	// packets, and packets too large for a datagram ride the stream as frames.
	KindUDP Kind = 2
	// KindTrace: a trace of a routed chain's route, measured end to end.
	// It travels the route as a TCP flow would, and the exit answers it at
	// once. Tunnel names the Chain; there is no target.
	KindTrace Kind = 3
	// KindLinks: a request for one relay's link measurements on a routed
	// chain. Tunnel names the Chain and Route is the path to the relay that
	// answers, the receiver first; the body that follows carries the
	// chain's current route as the asking entry uses it. There is no target.
	KindLinks Kind = 4
	// KindPacket: the session of a packet-mode tun Tunnel. Over QUIC its
	// IP packets ride datagrams, as a UDP session's do; over TLS the stream
	// carries them as packet frames (WritePacketFrame). Tunnel names the
	// Tunnel; there is no target.
	KindPacket Kind = 5
	// KindEcho: the ICMP echoes of one (source, destination, identifier)
	// of a flow-mode tun Tunnel, so that a ping is answered only when its
	// destination answers the exit. It rides as a UDP session does: each
	// datagram is one ICMP or ICMPv6 message, echo requests toward the
	// exit and echo replies back. Target is the destination as ip:0.
	KindEcho Kind = 6
)

func (k Kind) String() string {
	switch k {
	case KindTCP:
		return "tcp"
	case KindUDP:
		return "udp"
	case KindTrace:
		return "trace"
	case KindLinks:
		return "links"
	case KindPacket:
		return "packet"
	case KindEcho:
		return "echo"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

func (k Kind) valid() bool { return k >= KindTCP && k <= KindEcho }

// hasTarget reports whether headers of this kind name a target.
func (k Kind) hasTarget() bool { return k == KindTCP || k == KindUDP || k == KindEcho }

// Limits of a header. A relay never reads more than PrefixLen+MaxBodyLen
// bytes before deciding whether a stream is acceptable.
const (
	PrefixLen     = 4
	MaxBodyLen    = 2048
	MaxRouteLen   = 16
	MaxRelayName  = 63  // a DNS-1123 label
	MaxTunnelName = 317 // namespace (63) + "/" + name (253)
	MaxTarget     = 261 // a DNS name (253) + ":" + port, or a bracketed IPv6 literal
)

// Errors of Parse. Each means the stream is reset.
var (
	ErrVersion   = errors.New("hop: unsupported header version")
	ErrKind      = errors.New("hop: unknown stream kind")
	ErrTooLong   = errors.New("hop: header too long")
	ErrTruncated = errors.New("hop: header truncated")
	ErrTrailing  = errors.New("hop: trailing bytes after header")
	ErrField     = errors.New("hop: invalid field")
)

// Header is the per-flow header of one hop.
type Header struct {
	Kind Kind
	// Tunnel is the Tunnel's namespace/name (the Chain's, for probes and
	// link requests).
	Tunnel string
	// Route is the rest of the route, starting with the relay that receives
	// this header and ending with the chain's exit.
	Route []string
	// Target is the host:port the exit relay dials.
	Target string
	// Client and Listener (ip:port) are the client's address and the one
	// it connected to, as the entry saw them: set, for a Tunnel with
	// spec.proxyProtocol, so the exit can tell the target. Older relays
	// reject a header with them (trailing bytes).
	Client, Listener string
}

// MaxAddr bounds Client and Listener.
const MaxAddr = 64

// Append encodes h after b. It fails if h breaks a limit that Parse enforces,
// so a relay can never write a header its peer must reject.
func (h *Header) Append(b []byte) ([]byte, error) {
	if err := h.check(); err != nil {
		return b, err
	}
	start := len(b)
	b = append(b, Version, byte(h.Kind), 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Tunnel)))
	b = append(b, h.Tunnel...)
	b = append(b, byte(len(h.Route)))
	for _, r := range h.Route {
		b = append(b, byte(len(r)))
		b = append(b, r...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Target)))
	b = append(b, h.Target...)
	if h.Client != "" {
		b = append(b, byte(len(h.Client)))
		b = append(b, h.Client...)
		b = append(b, byte(len(h.Listener)))
		b = append(b, h.Listener...)
	}
	body := len(b) - start - PrefixLen
	if body > MaxBodyLen {
		return b[:start], ErrTooLong
	}
	binary.BigEndian.PutUint16(b[start+2:], uint16(body))
	return b, nil
}

// Parse decodes a whole header, prefix and body, and nothing else.
func Parse(b []byte) (Header, error) {
	if len(b) < PrefixLen {
		return Header{}, ErrTruncated
	}
	n, err := bodyLen(b[:PrefixLen])
	if err != nil {
		return Header{}, err
	}
	switch {
	case len(b) < PrefixLen+n:
		return Header{}, ErrTruncated
	case len(b) > PrefixLen+n:
		return Header{}, ErrTrailing
	}
	return parseBody(Kind(b[1]), b[PrefixLen:])
}

// Read reads one header from r, never more than the header itself, so the
// bytes of the flow that follow stay in r.
func Read(r io.Reader) (Header, error) {
	var buf [PrefixLen + MaxBodyLen]byte
	if _, err := io.ReadFull(r, buf[:PrefixLen]); err != nil {
		return Header{}, truncated(err)
	}
	n, err := bodyLen(buf[:PrefixLen])
	if err != nil {
		return Header{}, err
	}
	if _, err := io.ReadFull(r, buf[PrefixLen:PrefixLen+n]); err != nil {
		return Header{}, truncated(err)
	}
	return parseBody(Kind(buf[1]), buf[PrefixLen:PrefixLen+n])
}

func truncated(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return ErrTruncated
	}
	return err
}

func bodyLen(prefix []byte) (int, error) {
	if prefix[0] != Version {
		return 0, fmt.Errorf("%w %d (this relay speaks %d)", ErrVersion, prefix[0], Version)
	}
	if k := Kind(prefix[1]); !k.valid() {
		return 0, fmt.Errorf("%w %d", ErrKind, prefix[1])
	}
	n := int(binary.BigEndian.Uint16(prefix[2:]))
	if n > MaxBodyLen {
		return 0, ErrTooLong
	}
	return n, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = ErrTruncated
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.take(2)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(v))
}

func parseBody(kind Kind, body []byte) (Header, error) {
	r := &reader{b: body}
	h := Header{Kind: kind}
	h.Tunnel = string(r.take(r.u16()))
	n := r.u8()
	if r.err == nil && (n == 0 || n > MaxRouteLen) {
		return Header{}, fmt.Errorf("%w: route of %d relays (want 1-%d)", ErrField, n, MaxRouteLen)
	}
	for i := 0; i < n && r.err == nil; i++ {
		h.Route = append(h.Route, string(r.take(r.u8())))
	}
	h.Target = string(r.take(r.u16()))
	if r.err == nil && len(r.b) > 0 {
		h.Client = string(r.take(r.u8()))
		h.Listener = string(r.take(r.u8()))
	}
	if r.err != nil {
		return Header{}, r.err
	}
	if len(r.b) > 0 {
		return Header{}, ErrTrailing
	}
	if err := h.check(); err != nil {
		return Header{}, err
	}
	return h, nil
}

// check enforces the alphabets and lengths of every field.
func (h *Header) check() error {
	if !h.Kind.valid() {
		return fmt.Errorf("%w %d", ErrKind, uint8(h.Kind))
	}
	if !validTunnel(h.Tunnel) {
		return fmt.Errorf("%w: tunnel %q", ErrField, h.Tunnel)
	}
	if len(h.Route) == 0 || len(h.Route) > MaxRouteLen {
		return fmt.Errorf("%w: route of %d relays (want 1-%d)", ErrField, len(h.Route), MaxRouteLen)
	}
	for _, r := range h.Route {
		if !validLabel(r, MaxRelayName) {
			return fmt.Errorf("%w: relay name %q", ErrField, r)
		}
	}
	if h.Kind.hasTarget() && !validTarget(h.Target) || !h.Kind.hasTarget() && h.Target != "" {
		return fmt.Errorf("%w: target %q for a %s header", ErrField, h.Target, h.Kind)
	}
	if h.Client != "" || h.Listener != "" {
		if !h.Kind.hasTarget() || !validAddr(h.Client) || !validAddr(h.Listener) {
			return fmt.Errorf("%w: client %q, listener %q for a %s header", ErrField, h.Client, h.Listener, h.Kind)
		}
	}
	return nil
}

// validAddr accepts an ip:port without a zone.
func validAddr(s string) bool {
	if len(s) > MaxAddr {
		return false
	}
	a, err := netip.ParseAddrPort(s)
	return err == nil && a.Addr().Zone() == "" && a.String() == s
}

// validLabel accepts lowercase letters, digits, '-' and '.', as Kubernetes
// object names.
func validLabel(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validTunnel(s string) bool {
	if len(s) > MaxTunnelName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return validLabel(s[:i], 63) && validLabel(s[i+1:], 253)
		}
	}
	return false
}

// validTarget accepts printable ASCII without spaces; whether it is a real
// host:port the Tunnel allows is the relay's check, not the parser's.
func validTarget(s string) bool {
	if s == "" || len(s) > MaxTarget {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Code is why a relay ended a flow's hop. It travels as the QUIC stream
// reset's error code, and tells the relay beside it (and, in logs, the
// user) why the flow ended.
type Code uint64

// The codes a relay sends.
const (
	CodeReset      Code = 1 // the client or the target reset its connection
	CodeRejected   Code = 2 // the header failed a check: unknown tunnel, bad route or target
	CodeDialFailed Code = 3 // the exit relay could not connect to the target
	CodeNextHop    Code = 4 // the next relay could not be reached
	CodeShutdown   Code = 5 // the relay is shutting down
	CodeIdle       Code = 6 // a UDP session timed out
)
