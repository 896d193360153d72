package manifest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// problems collects field errors, each naming file, object and field, and
// remembers which objects have one.
type problems struct {
	errs []error
	objs map[string]bool // kind + " " + name
}

func (p *problems) add(src Source, kind, name, field, format string, args ...any) {
	p.addErr(kind, name, fmt.Errorf("%s: %s %q: %s: %s", src, kind, name, field, fmt.Sprintf(format, args...)))
}

// addErr records err, which names src, kind, name and field itself.
func (p *problems) addErr(kind, name string, err error) {
	p.errs = append(p.errs, err)
	if p.objs == nil {
		p.objs = map[string]bool{}
	}
	p.objs[kind+" "+name] = true
}

func (p *problems) err() error { return errors.Join(p.errs...) }

// Validate checks every object and every reference between them.
func (s *Set) Validate() error { return s.validate().err() }

func (s *Set) validate() *problems {
	p := &problems{}
	c := checker{s}
	for _, r := range s.Relays {
		c.validateRelay(p, r)
	}
	for _, ch := range s.Chains {
		c.validateChain(p, ch)
	}
	for _, t := range s.Tunnels {
		c.validateTunnel(p, t)
	}
	if !s.endpointsMayLack {
		c.validateEndpoints(p)
	}
	c.validateTunnelListeners(p)
	return p
}

// checker holds the checks of each kind of object in a Set, apart from
// the Set's own methods, which are what its users call.
type checker struct{ *Set }

func (s checker) validateRelay(p *problems, r *v1alpha1.RelayNode) {
	src, name := s.src[r], r.Name
	for _, msg := range validation.IsDNS1123Label(name) {
		p.add(src, "RelayNode", name, "metadata.name", "%s (relay names become certificate names)", msg)
	}
	if port := r.Spec.Listen.Port; port < 1 || port > 65535 {
		p.add(src, "RelayNode", name, "spec.listen.port", "%d is out of range; use 1-65535", port)
	}
	if a := r.Spec.Listen.Address; a != "" {
		if _, err := netip.ParseAddr(a); err != nil {
			p.add(src, "RelayNode", name, "spec.listen.address", "%q is not an IP address; leave it empty to bind every address", a)
		}
	}
	for i, ep := range r.Spec.Endpoints {
		if err := checkHostPort(ep); err != nil {
			p.add(src, "RelayNode", name, fmt.Sprintf("spec.endpoints[%d]", i), "%v", err)
		}
	}
}

func (s checker) validateChain(p *problems, c *v1alpha1.Chain) {
	src, name := s.src[c], Key(c.Namespace, c.Name)
	bad := func(field, format string, args ...any) { p.add(src, "Chain", name, field, format, args...) }
	if c.Name == "" {
		bad("metadata.name", "required")
	}
	known := func(field, relay string) bool {
		if relay == "" {
			bad(field, "required: name a RelayNode")
			return false
		}
		if s.relays[relay] == nil {
			bad(field, "unknown RelayNode %q (known: %s)%s", relay, strings.Join(s.RelayNames(), ", "), DidYouMean(relay, s.RelayNames()))
			return false
		}
		return true
	}
	known("spec.entry", c.Spec.Entry)
	known("spec.exit", c.Spec.Exit)
	for i, v := range c.Spec.Via {
		f := fmt.Sprintf("spec.via[%d]", i)
		if !known(f, v) {
			continue
		}
		switch {
		case v == c.Spec.Entry || v == c.Spec.Exit:
			bad(f, "%q is the chain's entry or exit; via lists only relays in between", v)
		case slices.Index(c.Spec.Via, v) != i:
			bad(f, "%q is listed twice", v)
		}
	}
	switch c.Spec.Mode {
	case v1alpha1.ModeStatic, v1alpha1.ModeSum, v1alpha1.ModePipe:
	default:
		bad("spec.mode", "%q is not a mode; use static, sum or pipe", c.Spec.Mode)
	}
	validateRouting(c, bad)
	if c.Spec.Mode.Routed() && c.Spec.Entry != "" && c.Spec.Entry == c.Spec.Exit {
		bad("spec.exit", "%q is also the entry; a %s chain routes between two relays (for a plain port forward use mode static and route [%s])",
			c.Spec.Exit, c.Spec.Mode, c.Spec.Entry)
	}
	switch c.Spec.Transport {
	case v1alpha1.TransportAuto, v1alpha1.TransportQUIC, v1alpha1.TransportTLS:
	default:
		bad("spec.transport", "%q is not a transport; use auto, quic or tls", c.Spec.Transport)
	}
	route := c.Spec.Route
	if c.Spec.Mode == v1alpha1.ModeStatic && len(route) == 0 {
		bad("spec.route", "required for static mode: list the relays from entry %q to exit %q", c.Spec.Entry, c.Spec.Exit)
		return
	}
	if len(route) == 0 {
		return
	}
	if route[0] != c.Spec.Entry {
		bad("spec.route[0]", "%q must be the entry %q", route[0], c.Spec.Entry)
	}
	if last := route[len(route)-1]; last != c.Spec.Exit {
		bad(fmt.Sprintf("spec.route[%d]", len(route)-1), "%q must be the exit %q", last, c.Spec.Exit)
	}
	for i, hop := range route {
		f := fmt.Sprintf("spec.route[%d]", i)
		switch {
		case s.relays[hop] == nil:
			bad(f, "unknown RelayNode %q (known: %s)%s", hop, strings.Join(s.RelayNames(), ", "), DidYouMean(hop, s.RelayNames()))
		case slices.Index(route, hop) != i:
			bad(f, "%q appears twice; a route visits each relay once", hop)
		case i > 0 && i < len(route)-1 && !slices.Contains(c.Spec.Via, hop):
			bad(f, "%q is not in spec.via; add it there or take it out of the route", hop)
		}
	}
	if c.Spec.Mode.Routed() && len(route)-1 > int(c.Spec.MaxHops) {
		bad("spec.route", "%d links, more than spec.maxHops (%d) allows", len(route)-1, c.Spec.MaxHops)
	}
}

// validateRouting checks the fields that tune sum and pipe routing. They are
// checked in every mode, so that switching a chain to sum mode cannot
// uncover an old mistake.
func validateRouting(c *v1alpha1.Chain, bad func(field, format string, args ...any)) {
	if n := c.Spec.MaxHops; n < 1 || n > 15 {
		bad("spec.maxHops", "%d is out of range; use 1-15", n)
	}
	if p := c.Spec.Probe; p != nil {
		if iv := p.Interval; iv != nil && (iv.Duration < 100*time.Millisecond || iv.Duration > 10*time.Minute) {
			bad("spec.probe.interval", "%v is out of range; use 100ms to 10m", iv.Duration)
		}
		if n := p.Candidates; n < 1 || n > 8 {
			bad("spec.probe.candidates", "%d is out of range; use 1-8", n)
		}
	}
	if h := c.Spec.Hysteresis; h != nil {
		if p := h.Percent; p != nil && (*p < 0 || *p > 100) {
			bad("spec.hysteresis.percent", "%d is out of range; use 0-100", *p)
		}
		if m := h.Min; m != nil && (m.Duration < 0 || m.Duration > time.Minute) {
			bad("spec.hysteresis.min", "%v is out of range; use 0 to 1m", m.Duration)
		}
		if n := h.Rounds; n < 1 || n > 100 {
			bad("spec.hysteresis.rounds", "%d is out of range; use 1-100", n)
		}
	}
}

func (s checker) validateTunnel(p *problems, t *v1alpha1.Tunnel) {
	src, name := s.src[t], Key(t.Namespace, t.Name)
	bad := func(field, format string, args ...any) { p.add(src, "Tunnel", name, field, format, args...) }
	if t.Name == "" {
		bad("metadata.name", "required")
	}
	if t.Spec.Chain == "" {
		bad("spec.chain", "required: name a Chain")
	} else if s.ChainOf(t) == nil {
		var names []string
		for _, c := range s.Chains {
			if c.Namespace == t.Namespace {
				names = append(names, c.Name)
			}
		}
		bad("spec.chain", "unknown Chain %q in namespace %q (it has: %s)%s", t.Spec.Chain, t.Namespace, orNone(names), DidYouMean(t.Spec.Chain, names))
	}
	switch t.Spec.Protocol {
	case v1alpha1.ProtocolTCP, v1alpha1.ProtocolUDP:
		validatePortForward(t, bad)
	case v1alpha1.ProtocolTUN:
		validateTun(t, bad)
	default:
		bad("spec.protocol", "%q is not supported; use tcp, udp or tun", t.Spec.Protocol)
	}
}

// validatePortForward checks a tcp or udp Tunnel: a listener and a target.
func validatePortForward(t *v1alpha1.Tunnel, bad func(field, format string, args ...any)) {
	if t.Spec.TUN != nil {
		bad("spec.tun", "applies to protocol tun only; remove it or set spec.protocol: tun")
	}
	if l := t.Spec.Listen; l == nil {
		bad("spec.listen", "required for protocol %s: the address and port the entry relay opens", t.Spec.Protocol)
	} else {
		if l.Port < 1 || l.Port > 65535 {
			bad("spec.listen.port", "%d is out of range; use 1-65535", l.Port)
		}
		if l.Address != "" {
			if _, err := netip.ParseAddr(l.Address); err != nil {
				bad("spec.listen.address", "%q is not an IP address; leave it empty to bind every address", l.Address)
			}
		}
		if _, err := AllowedSources(l); err != nil {
			bad("spec.listen.allowedSources", "%v", err)
		}
	}
	if t.Spec.Target == "" {
		bad("spec.target", "required: the host:port the exit relay dials")
	} else if err := checkHostPort(t.Spec.Target); err != nil {
		bad("spec.target", "%v", err)
	}
	if c := t.Spec.TCP; c != nil {
		if t.Spec.Protocol != v1alpha1.ProtocolTCP {
			bad("spec.tcp", "applies to protocol tcp only")
		}
		if c.IdleTimeoutSeconds < 1 || c.IdleTimeoutSeconds > 604800 {
			bad("spec.tcp.idleTimeoutSeconds", "%d must be from 1 to 604800 (a week)", c.IdleTimeoutSeconds)
		}
	}
	switch pp := t.Spec.ProxyProtocol; {
	case pp == "":
	case pp != v1alpha1.ProxyV1 && pp != v1alpha1.ProxyV2:
		bad("spec.proxyProtocol", "%q is not a version; use v1 or v2", pp)
	case pp == v1alpha1.ProxyV1 && t.Spec.Protocol == v1alpha1.ProtocolUDP:
		bad("spec.proxyProtocol", "protocol udp takes only v2 (v1 is text for TCP)")
	}
	if l := t.Spec.Limits; l != nil {
		if l.RateMbps != 0 && (l.RateMbps < 1 || l.RateMbps > 100000) {
			bad("spec.limits.rateMbps", "%d must be from 1 to 100000 (100 Gbit/s), or left out for no limit", l.RateMbps)
		}
		if l.MaxFlows != 0 && (l.MaxFlows < 1 || l.MaxFlows > 1000000) {
			bad("spec.limits.maxFlows", "%d must be from 1 to 1000000, or left out for the relays' share", l.MaxFlows)
		}
		if l.Weight != 0 && (l.Weight < 1 || l.Weight > 100) {
			bad("spec.limits.weight", "%d must be from 1 to 100, or left out for 1 (an even share)", l.Weight)
		}
	}
	if u := t.Spec.UDP; u != nil {
		if t.Spec.Protocol != v1alpha1.ProtocolUDP {
			bad("spec.udp", "applies to protocol udp only")
		}
		if u.IdleTimeoutSeconds < 1 {
			bad("spec.udp.idleTimeoutSeconds", "%d must be at least 1", u.IdleTimeoutSeconds)
		}
		if u.MaxSessions < 1 {
			bad("spec.udp.maxSessions", "%d must be at least 1", u.MaxSessions)
		}
		switch u.Mode {
		case v1alpha1.UDPAuto, v1alpha1.UDPDatagram, v1alpha1.UDPStream:
		default:
			bad("spec.udp.mode", "%q is not a mode; use auto, datagram or stream", u.Mode)
		}
	}
}

// validateTun checks a tun Tunnel: a device, and the prefixes it reaches.
func validateTun(t *v1alpha1.Tunnel, bad func(field, format string, args ...any)) {
	if t.Spec.Listen != nil {
		bad("spec.listen", "protocol tun opens no listener (its device is its way in); remove spec.listen")
	}
	if t.Spec.Target != "" {
		bad("spec.target", "protocol tun reaches the destinations of spec.tun.routes, not one target; remove spec.target")
	}
	if t.Spec.UDP != nil {
		bad("spec.udp", "applies to protocol udp only")
	}
	if t.Spec.TCP != nil {
		bad("spec.tcp", "applies to protocol tcp only")
	}
	if t.Spec.ProxyProtocol != "" {
		bad("spec.proxyProtocol", "protocol tun has no target to tell; remove it")
	}
	if t.Spec.Limits != nil {
		bad("spec.limits", "applies to protocol tcp and udp only; remove it from a tun Tunnel")
	}
	u := t.Spec.TUN
	if u == nil {
		bad("spec.tun", "required for protocol tun: give at least address and routes, e.g. {address: 10.200.0.1/24, routes: [10.77.0.0/16]}")
		return
	}
	if !validIfName(u.Name) {
		bad("spec.tun.name", "%q is not a device name: 1-15 letters, digits, '-', '_' or '.'", u.Name)
	}
	addr, err := netip.ParsePrefix(u.Address)
	switch {
	case err != nil:
		bad("spec.tun.address", "%q is not an address with its prefix, such as 10.200.0.1/24 or fd20::1/64", u.Address)
	case addr.Addr().Is4In6():
		bad("spec.tun.address", "%q is IPv4-mapped IPv6, which never crosses a device; write %s/%d", u.Address, addr.Addr().Unmap(), max(addr.Bits()-96, 0))
	}
	// IPv6 carries 1280-byte packets on every link, a device too: below
	// that the kernel keeps IPv6 off the device.
	v6 := addr.Addr().Is6()
	checkPrefixes := func(field string, list []string) {
		for i, r := range list {
			p, err := netip.ParsePrefix(r)
			switch {
			case err != nil:
				bad(fmt.Sprintf("%s[%d]", field, i), "%q is not a prefix, such as 10.77.0.0/16 or fd77::/64", r)
			case p.Addr().Is4In6():
				bad(fmt.Sprintf("%s[%d]", field, i), "%q is IPv4-mapped IPv6, which no packet carries; write %s", r, netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0)).Masked())
			case p != p.Masked():
				bad(fmt.Sprintf("%s[%d]", field, i), "%q has host bits set; write %s", r, p.Masked())
			default:
				v6 = v6 || p.Addr().Is6()
			}
		}
	}
	if len(u.Routes) == 0 {
		bad("spec.tun.routes", "required: the prefixes the device carries, e.g. [10.77.0.0/16]")
	}
	checkPrefixes("spec.tun.routes", u.Routes)
	switch {
	case u.MTU < 1280 && v6:
		bad("spec.tun.mtu", "%d is below 1280, the least IPv6 allows, and the device carries IPv6; use 1280-9000", u.MTU)
	case u.MTU < 1280 || u.MTU > 9000:
		bad("spec.tun.mtu", "%d is out of range; use 1280-9000", u.MTU)
	}
	switch u.Mode {
	case v1alpha1.TunFlow:
		if u.ExitAddress != "" || len(u.Sources) > 0 {
			bad("spec.tun", "exitAddress and sources apply to mode packet only")
		}
	case v1alpha1.TunPacket:
		checkPrefixes("spec.tun.sources", u.Sources)
		if u.ExitAddress != "" {
			exit, err := netip.ParsePrefix(u.ExitAddress)
			switch {
			case err != nil:
				bad("spec.tun.exitAddress", "%q is not an address with its prefix, such as 10.200.0.2/24", u.ExitAddress)
			case addr.IsValid() && (exit.Masked() != addr.Masked() || exit.Addr() == addr.Addr()):
				bad("spec.tun.exitAddress", "%s must be another address in the prefix of spec.tun.address (%s)", exit, addr.Masked())
			}
		} else if next := addr.Addr().Next(); addr.IsValid() && (!next.IsValid() || !addr.Contains(next)) {
			bad("spec.tun.exitAddress", "%s leaves no next address in its prefix for the exit; give spec.tun.exitAddress", addr)
		}
	default:
		bad("spec.tun.mode", "%q is not a mode; use flow or packet", u.Mode)
	}
}

// validIfName accepts Linux interface names: 1-15 bytes, no '/' or space.
func validIfName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// validateEndpoints requires an address for every relay that some peer dials.
func (s checker) validateEndpoints(p *problems) {
	for _, r := range s.Relays {
		// A sidecar relay's endpoints are its ready replicas, found at run
		// time; none ready fails new flows, and must not drop its chains.
		if len(r.Spec.Endpoints) > 0 || r.Spec.IsSidecar() {
			continue
		}
		for _, c := range s.Chains {
			if !slices.Contains(Receivers(c), r.Name) {
				continue
			}
			role := fmt.Sprintf("is hop %d of Chain %q", slices.Index(Route(c), r.Name), Key(c.Namespace, c.Name))
			if c.Spec.Mode.Routed() {
				role = fmt.Sprintf("may carry flows of %s Chain %q", c.Spec.Mode, Key(c.Namespace, c.Name))
			}
			p.addErr("RelayNode", r.Name, &MissingEndpointError{
				err:   fmt.Errorf("%s: RelayNode %q: spec.endpoints: required: relay %q %s, so peers must know where to dial it: %s", s.src[r], r.Name, r.Name, role, endpointHint(r)),
				Relay: r.Name, Port: r.Spec.Listen.Port,
			})
			break
		}
	}
}

// MissingEndpointError is a relay that peers dial without spec.endpoints:
// the relay's own process, which knows its host, may say more.
type MissingEndpointError struct {
	err   error
	Relay string
	Port  int32
}

func (e *MissingEndpointError) Error() string { return e.err.Error() }

// endpointHint suggests endpoints for r. Its own listen address when that
// names one; else an address of its host, which these files do not know:
// loopback, what suits only relays that share one host, must not read as
// the answer for a relay on a host of its own.
func endpointHint(r *v1alpha1.RelayNode) string {
	port := strconv.Itoa(int(r.Spec.Listen.Port))
	if a, err := netip.ParseAddr(r.Spec.Listen.Address); err == nil && !a.IsUnspecified() {
		return fmt.Sprintf("it listens on %s only, so endpoints: [%q]", a, net.JoinHostPort(a.String(), port))
	}
	return fmt.Sprintf("give the address or name other hosts reach its host at, e.g. endpoints: [%q] (or [%q] when every relay runs on one host, as with hoplink local)",
		net.JoinHostPort(r.Name+".example.net", port), net.JoinHostPort("127.0.0.1", port))
}

type listenKey struct {
	proto string
	addr  string
	port  int32
}

// overlaps reports whether two binds collide: same protocol and port, and the
// same address or either one binding every address.
func (a listenKey) overlaps(b listenKey) bool {
	return a.proto == b.proto && a.port == b.port && (a.addr == b.addr || a.addr == "" || b.addr == "")
}

// validateTunnelListeners rejects two Tunnels that would bind the same port
// on the same entry relay.
func (s checker) validateTunnelListeners(p *problems) {
	// Binds collide only on one protocol and port, so each entry relay's
	// are kept by those: a relay with 10,000 Tunnels compares each with
	// the few of its port, not with all the others.
	type bucket struct {
		entry, proto string
		port         int32
	}
	seen := map[bucket][]*v1alpha1.Tunnel{}
	devices := map[[2]string]*v1alpha1.Tunnel{} // entry relay, device name
	for _, t := range s.Tunnels {
		c := s.ChainOf(t)
		if c == nil || t.Spec.Listen == nil && t.Spec.TUN == nil {
			continue
		}
		if u := t.Spec.TUN; u != nil {
			d := [2]string{c.Spec.Entry, u.Name}
			if o := devices[d]; o != nil {
				p.add(s.src[t], "Tunnel", Key(t.Namespace, t.Name), "spec.tun.name",
					"device %q is Tunnel %q's on entry relay %q; give this Tunnel another spec.tun.name", u.Name, Key(o.Namespace, o.Name), c.Spec.Entry)
			}
			devices[d] = t
			continue
		}
		k := tunnelListen(t)
		if r := s.relays[c.Spec.Entry]; r != nil && k.overlaps(listenKey{k.proto, r.Spec.Listen.Address, r.Spec.Listen.Port}) {
			p.add(s.src[t], "Tunnel", Key(t.Namespace, t.Name), "spec.listen.port",
				"%d is entry relay %q's own port (QUIC on UDP, TLS on TCP); pick another port", k.port, r.Name)
			continue
		}
		b := bucket{c.Spec.Entry, k.proto, k.port}
		for _, o := range seen[b] {
			if tunnelListen(o).overlaps(k) {
				p.add(s.src[t], "Tunnel", Key(t.Namespace, t.Name), "spec.listen",
					"%s %s collides with Tunnel %q on entry relay %q; pick another port",
					k.proto, net.JoinHostPort(k.addr, strconv.Itoa(int(k.port))), Key(o.Namespace, o.Name), c.Spec.Entry)
				break
			}
		}
		seen[b] = append(seen[b], t)
	}
}

func tunnelListen(t *v1alpha1.Tunnel) listenKey {
	return listenKey{string(t.Spec.Protocol), t.Spec.Listen.Address, t.Spec.Listen.Port}
}

// CheckSingleHost rejects listeners that would collide when every relay runs
// on one host, as in local mode: two relays on one UDP port, or a UDP Tunnel
// on a relay's port.
func (s *Set) CheckSingleHost() error {
	var p problems
	type owner struct {
		key  listenKey
		desc string
	}
	// By protocol and port, the only binds that may collide.
	type bucket struct {
		proto string
		port  int32
	}
	taken := map[bucket][]owner{}
	claim := func(src Source, kind, name, field string, k listenKey, desc string) {
		b := bucket{k.proto, k.port}
		for _, o := range taken[b] {
			if o.key.overlaps(k) {
				p.add(src, kind, name, field, "%s %s collides with %s; every relay of local mode shares this host, so pick another port",
					k.proto, net.JoinHostPort(k.addr, strconv.Itoa(int(k.port))), o.desc)
				return
			}
		}
		taken[b] = append(taken[b], owner{k, desc})
	}
	for _, r := range s.Relays {
		for _, proto := range []string{"udp", "tcp"} { // QUIC and TLS share the port number
			claim(s.src[r], "RelayNode", r.Name, "spec.listen",
				listenKey{proto, r.Spec.Listen.Address, r.Spec.Listen.Port}, fmt.Sprintf("RelayNode %q", r.Name))
		}
	}
	devices := map[string]string{}
	for _, t := range s.Tunnels {
		key := Key(t.Namespace, t.Name)
		if u := t.Spec.TUN; u != nil {
			// One host, one namespace: device names are shared, and a packet
			// mode Tunnel would need a second device of the same name.
			if u.Mode == v1alpha1.TunPacket {
				p.add(s.src[t], "Tunnel", key, "spec.tun.mode",
					"packet mode joins two hosts' networks and needs a device at both ends; on one host use mode flow")
			}
			if o, taken := devices[u.Name]; taken {
				p.add(s.src[t], "Tunnel", key, "spec.tun.name", "device %q is Tunnel %q's; every relay of local mode shares this host", u.Name, o)
			}
			devices[u.Name] = key
			continue
		}
		if t.Spec.Listen != nil {
			claim(s.src[t], "Tunnel", key, "spec.listen", tunnelListen(t), fmt.Sprintf("Tunnel %q", key))
		}
	}
	return p.err()
}

// RelayNames are the RelayNodes' names, in the order read.
func (s *Set) RelayNames() []string {
	names := make([]string, 0, len(s.Relays))
	for _, r := range s.Relays {
		names = append(names, r.Name)
	}
	return names
}

func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q is not host:port (%v)", hp, strings.TrimPrefix(err.Error(), "address "+hp+": "))
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hp)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is out of range; use 1-65535", hp, port)
	}
	return nil
}

// orNone lists names, or says there are none.
func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// maxAllowedSources bounds spec.listen.allowedSources, as the CRD does.
const maxAllowedSources = 64

// AllowedSources returns the networks a Tunnel's entry takes clients from
// (spec.listen.allowedSources, masked to their prefix), or nil for every
// source.
func AllowedSources(l *v1alpha1.TunnelListen) ([]netip.Prefix, error) {
	if l == nil || len(l.AllowedSources) == 0 {
		return nil, nil
	}
	if len(l.AllowedSources) > maxAllowedSources {
		return nil, fmt.Errorf("%d networks; at most %d", len(l.AllowedSources), maxAllowedSources)
	}
	out := make([]netip.Prefix, 0, len(l.AllowedSources))
	for _, c := range l.AllowedSources {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8 or 2001:db8::/32", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
