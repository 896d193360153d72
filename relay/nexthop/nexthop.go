// Package nexthop is how a relay reaches the next relay of a route. Peers
// owns the relay's QUIC and TLS endpoints: it accepts its peers' streams
// (handing them to the relay's dispatcher), keeps its links up, and opens a
// hop for a header, over the chain's transport, with one set of errors. The
// entries of every protocol, middle relays, traces and link requests all
// open hops here.
package nexthop

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/relay/tlslink"
)

// Options configure Peers.
type Options struct {
	Name     string
	Identity *pki.Identity
	// Listen is the relay's host:port, for QUIC on UDP and TLS on TCP.
	Listen string
	// SeparateDialPort is rquic.Options'.
	SeparateDialPort bool
	// Congestion is the TCP congestion control of the TLS links.
	Congestion tlslink.Congestion
	Metrics    *metrics.Metrics
	Log        *slog.Logger
}

// Peers is a relay's side of its links to other relays.
type Peers struct {
	o     Options
	quic  *rquic.Endpoint
	links *rquic.Links // quic's
	tls   *tlslink.Endpoint
	pools *tlslink.Pools // tls's

	mu    sync.Mutex
	peers map[string]Peer // by name (SetPeers)
	order []Peer          // as given

	headers pending // QUIC streams waiting for their header
	hops    *Hops
	auto    *chooser // the transport flows to each peer take under auto, shared with hops
	up      Upper    // from Listen
}

// New makes a relay's Peers; Listen binds them. The two steps let the
// roles above be built with the Peers and their Hops, and the layer above
// them given to Listen, before the first stream arrives.
func New(o Options) *Peers {
	p := &Peers{o: o, auto: newChooser()}
	p.hops = newHops(p, o, p.auto)
	return p
}

// Hops opens hops to the peers.
func (p *Peers) Hops() *Hops { return p.hops }

// Listen binds the relay's QUIC and TLS listeners on the same port number,
// which admit the peers SetPeers gave, and starts their links. up serves
// what peers open and hears what the link layer learns of them; admin
// serves the admin API on the TLS port.
func (p *Peers) Listen(up Upper, admin http.Handler) error {
	o := p.o
	p.up = up
	p.mu.Lock()
	peers := p.order
	p.mu.Unlock()
	conns, names := admission(peers)
	q, err := rquic.Listen(rquic.Options{Name: o.Name, Identity: o.Identity, Listen: o.Listen, Peers: conns, SeparateDialPort: o.SeparateDialPort,
		Upper: fromQUIC{p}, Metrics: o.Metrics, Log: o.Log})
	if err != nil {
		return err
	}
	t, err := tlslink.Listen(tlslink.Options{Name: o.Name, Identity: o.Identity, Listen: o.Listen, Peers: names,
		Upper: fromTLS{p}, Admin: admin, Congestion: o.Congestion, Metrics: o.Metrics, Log: o.Log})
	if err != nil {
		q.Close()
		return err
	}
	p.quic, p.links, p.tls, p.pools = q, q.Links(), t, t.Pools()
	p.start(peers)
	return nil
}

// Addr is the bound QUIC address.
func (p *Peers) Addr() net.Addr { return p.quic.Addr() }

// Close ends every connection, in and out.
func (p *Peers) Close() error {
	if p.quic == nil {
		return nil
	}
	return errors.Join(p.tls.Close(), p.quic.Close())
}

// SetCongestion makes TLS links made from now on run c's algorithm.
func (p *Peers) SetCongestion(c tlslink.Congestion) { p.tls.SetCongestion(c) }

// Drain tells the peers that this relay takes no new flows.
func (p *Peers) Drain() { p.quic.Drain() }

// Settle waits, after a drain saw its last flow end, until the peers
// closed their QUIC connections (they do once they read what this relay
// sent) or ctx ends; it returns how many were still up.
func (p *Peers) Settle(ctx context.Context) int { return p.quic.Settle(ctx) }

// Recheck closes the connections, QUIC and TLS, whose peer no longer
// holds: its certificate expired, or (full) it is no longer among the
// peers SetPeers gave; with full, TLS sessions made under the previous CAs
// stop resuming.
func (p *Peers) Recheck(full bool) int {
	return p.quic.Recheck(full) + p.tls.Recheck(full)
}

// Congestion is the TCP congestion control the TLS links run, and why.
type Congestion = tlslink.Congestion

// ChooseCongestion decides what the TLS links run for a RelayNode's
// spec.links.congestionControl (tlslink.ChooseCongestion).
func ChooseCongestion(want string) Congestion { return tlslink.ChooseCongestion(want) }
