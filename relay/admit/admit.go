// Package admit decides what a relay may do for whom, and nothing else: it
// is the one place where a stream's header, an admin call or an IP packet
// is checked against the manifests. Every function is pure (no I/O, no
// clock): given the manifests, this relay, the authenticated peer and the
// parsed request, it returns what the request may use, or a Refusal whose
// Reason is the label the relay counts it under.
package admit

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
)

// Reasons of a Refusal. A stream's (Stream) are the reason label of
// hoplink_rejected_streams_total; an admin call's (Admin, AdminStatus) go
// back in the admin API's answer and count nowhere.
const (
	UnknownTunnel = "unknown_tunnel"
	UnknownChain  = "unknown_chain"
	WrongProtocol = "wrong_protocol"
	BadRoute      = "bad_route"
	BadTarget     = "bad_target"
	// An admin call's only.
	NotMember   = "not_member"
	NotEntry    = "not_entry"
	NotOperator = "not_operator"
)

// Refusal says why a request was refused.
type Refusal struct {
	// Reason is a short label for metrics and answers.
	Reason string
	Err    error
}

func (r *Refusal) Error() string { return r.Err.Error() }

func refuse(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Transport is how a stream reached the relay.
type Transport uint8

const (
	QUIC Transport = iota
	TLS
)

// Grant is what an admitted stream may use.
type Grant struct {
	// Chain is the stream's chain: its Tunnel's, or the one a trace or link
	// request names.
	Chain *v1alpha1.Chain
	// Tunnel is the stream's Tunnel (TCP, UDP and packet streams).
	Tunnel *v1alpha1.Tunnel
	// Last: this relay ends the stream's route (it is the exit, or the
	// relay a link request is for); else it passes the stream on.
	Last bool
}

// Stream admits a stream (or a TLS connection) that peer opened to relay
// self, with header h. A flow must belong to a Tunnel of the manifests, be
// of its protocol, follow a route its Chain allows as seen from self and
// the peer that sent it (manifest.AllowsHop; or one of the Chain's
// versions live at now, Set.AdmitsHop), and go to the Tunnel's own
// target; a trace must follow such a route of a routed chain; a link
// request must be on a path of one (manifest.AllowsPath) and come from its
// entry or a via relay. A relay with a valid certificate can therefore ask
// a peer for nothing the manifests do not already allow.
func Stream(set *manifest.Set, self, peer string, h *hop.Header, tr Transport, now time.Time) (Grant, *Refusal) {
	if peer == "" || peer == self {
		return Grant{}, refuse(BadRoute, "a stream from %q to itself", self)
	}
	switch h.Kind {
	case hop.KindTrace, hop.KindLinks:
		return routing(set, self, peer, h, tr, now)
	}
	t := set.Tunnel(h.Tunnel)
	if t == nil {
		return Grant{}, refuse(UnknownTunnel, "no Tunnel %q", h.Tunnel)
	}
	u := t.Spec.TUN
	tunFlow := u != nil && u.Mode == v1alpha1.TunFlow && (h.Kind == hop.KindTCP || h.Kind == hop.KindUDP || h.Kind == hop.KindEcho)
	tunPacket := u != nil && u.Mode == v1alpha1.TunPacket && h.Kind == hop.KindPacket
	if string(t.Spec.Protocol) != h.Kind.String() && !tunFlow && !tunPacket {
		return Grant{}, refuse(WrongProtocol, "Tunnel %q is %s, stream is %s", h.Tunnel, t.Spec.Protocol, h.Kind)
	}
	if (h.Kind == hop.KindUDP || h.Kind == hop.KindEcho) && tunFlow && tr != QUIC {
		return Grant{}, refuse(WrongProtocol, "a tun Tunnel's UDP flows and echoes ride QUIC, not TLS")
	}
	chain := set.ChainOf(t)
	if chain == nil {
		return Grant{}, refuse(UnknownChain, "Tunnel %q has no Chain %q", h.Tunnel, t.Spec.Chain)
	}
	if !set.AdmitsHop(chain, peer, self, h.Route, now) {
		return Grant{}, refuse(BadRoute, "route %v from %q is not a route of Chain %q", h.Route, peer, chain.Name)
	}
	g := Grant{Chain: chain, Tunnel: t, Last: len(h.Route) == 1}
	switch {
	case tunPacket:
		// Its packets are checked one by one (Packets).
	case tunFlow:
		// A tun Tunnel reaches the addresses of its routes, and no other.
		if !manifest.TunReaches(t, h.Target) {
			return Grant{}, refuse(BadTarget, "target %q is outside Tunnel %q's routes %v", h.Target, h.Tunnel, u.Routes)
		}
		if ap, _ := netip.ParseAddrPort(h.Target); h.Kind == hop.KindEcho && ap.Port() != 0 {
			return Grant{}, refuse(BadTarget, "echo target %q names a port", h.Target)
		}
	case h.Target != t.Spec.Target:
		return Grant{}, refuse(BadTarget, "target %q is not Tunnel %q's target", h.Target, h.Tunnel)
	}
	return g, nil
}

// routing admits a trace or a link request, whose tunnel field names a
// routed Chain.
func routing(set *manifest.Set, self, peer string, h *hop.Header, tr Transport, now time.Time) (Grant, *Refusal) {
	c, ref := routedChain(set, h.Tunnel)
	if h.Kind == hop.KindTrace {
		// `hoplink probe` traces static chains too.
		c, ref = anyChain(set, h.Tunnel)
	}
	if ref != nil {
		return Grant{}, ref
	}
	switch h.Kind {
	case hop.KindTrace:
		if !set.AdmitsHop(c, peer, self, h.Route, now) {
			return Grant{}, refuse(BadRoute, "route %v from %q is not a route of Chain %q", h.Route, peer, h.Tunnel)
		}
	default: // hop.KindLinks
		if tr != QUIC {
			return Grant{}, refuse(WrongProtocol, "link requests ride QUIC, not TLS")
		}
		if !manifest.AllowsPath(c, peer, self, h.Route) {
			return Grant{}, refuse(BadRoute, "link request along %v from %q is not on a route of Chain %q", h.Route, peer, h.Tunnel)
		}
	}
	return Grant{Chain: c, Last: len(h.Route) == 1}, nil
}

func anyChain(set *manifest.Set, key string) (*v1alpha1.Chain, *Refusal) {
	c := set.Chain(key)
	if c == nil {
		return nil, refuse(UnknownChain, "no Chain %q", key)
	}
	return c, nil
}

func routedChain(set *manifest.Set, key string) (*v1alpha1.Chain, *Refusal) {
	c := set.Chain(key)
	switch {
	case c == nil:
		return nil, refuse(UnknownChain, "no Chain %q", key)
	case !c.Spec.Mode.Routed():
		return nil, refuse(UnknownChain, "Chain %q is %s, not routed", key, c.Spec.Mode)
	}
	return c, nil
}

// AdminCall is a request of the relay admin API.
type AdminCall uint8

const (
	// AdminLinks asks a relay of a routed chain for its table.
	AdminLinks AdminCall = iota
	// AdminTrace asks a routed chain's entry to trace routes.
	AdminTrace
)

// Admin admits an admin API call from client (the name its certificate
// proves) about chain: only the operator (about routed chains, which it
// routes) and the observer (`hoplink probe`, any chain) may call; a table
// only from a relay the chain's rounds ask, traces only from the chain's
// entry.
func Admin(set *manifest.Set, self, client string, call AdminCall, chain string) (*v1alpha1.Chain, *Refusal) {
	var c *v1alpha1.Chain
	var ref *Refusal
	switch client {
	case pki.OperatorName:
		c, ref = routedChain(set, chain)
	case pki.ObserverName:
		c, ref = anyChain(set, chain)
	default:
		return nil, refuse(NotOperator, "%q may not use the admin API", client)
	}
	if ref != nil {
		return nil, ref
	}
	switch call {
	case AdminLinks:
		asked := manifest.Measured(c)
		if client == pki.ObserverName {
			asked = manifest.Members(c)
		}
		if !slices.Contains(asked, self) {
			return nil, refuse(NotMember, "relay %q is not on Chain %q", self, chain)
		}
	case AdminTrace:
		if c.Spec.Entry != self {
			return nil, refuse(NotEntry, "relay %q is not the entry of Chain %q; ask %q", self, chain, c.Spec.Entry)
		}
	}
	return c, nil
}

// AdminStatus admits a call for the relay's own status: the operator's
// and the observer's.
func AdminStatus(client string) *Refusal {
	if !pki.AdminClient(client) {
		return refuse(NotOperator, "%q may not use the admin API", client)
	}
	return nil
}

// TraceRoute says whether the entry self may trace route rt of chain c: a
// route the spec allows that starts here and has a hop to trace.
func TraceRoute(c *v1alpha1.Chain, self string, rt []string) *Refusal {
	valid := manifest.ValidRoute(c, rt) == nil
	if !c.Spec.Mode.Routed() {
		valid = slices.Equal(rt, manifest.Route(c))
	}
	if !valid || len(rt) < 2 || rt[0] != self {
		return refuse(BadRoute, "route %v cannot be traced from relay %q", rt, self)
	}
	return nil
}
