package quic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// Options configure an Endpoint.
type Options struct {
	// Name of this relay; the metrics' relay label.
	Name     string
	Identity *pki.Identity
	// Listen is the UDP host:port for QUIC; peers are dialed from the same
	// socket.
	Listen string
	// MaxStreams bounds the flows one peer may have open at once; 0 means
	// DefaultMaxStreams.
	MaxStreams int64
	// KnownPeer says whether a relay of that name may connect; a peer with a
	// valid certificate that no manifest names is turned away.
	KnownPeer func(name string) bool
	// Handler serves a stream a peer opened. It owns the stream.
	Handler func(c *Conn, s *quicgo.Stream)
	// OnProbeEcho receives the answers to link probes sent on connections
	// this endpoint dialed (see Conn.SendProbe).
	OnProbeEcho func(peer string, payload []byte)
	Metrics     *metrics.Metrics
	Log         *slog.Logger
}

// Endpoint is a relay's QUIC side: it accepts peers and dials them.
type Endpoint struct {
	opts   Options
	udp    *net.UDPConn
	tr     *quicgo.Transport
	ln     *quicgo.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	links map[string]*Link
	conns map[*Conn]struct{}
}

// Listen binds the UDP socket and starts accepting peers.
func Listen(opts Options) (*Endpoint, error) {
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	addr, err := net.ResolveUDPAddr("udp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay listen address %q: %w", opts.Listen, err)
	}
	udp, err := net.ListenUDP("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	resetKey, err := opts.Identity.DeriveKey("stateless reset")
	if err != nil {
		udp.Close()
		return nil, err
	}
	e := &Endpoint{
		opts: opts,
		udp:  udp,
		tr: &quicgo.Transport{Conn: udp, StatelessResetKey: (*quicgo.StatelessResetKey)(&resetKey),
			// quic-go takes datagrams of up to path MTU - 37 bytes. A
			// packet carrying one (1 byte flags, the connection ID, a
			// 2-byte packet number, 1 byte frame type, 16 bytes AEAD tag)
			// is exactly full with 17-byte IDs: with the default 4 it is
			// 13 bytes short, and a short packet ends a GSO batch, one
			// sendmsg per datagram. Packet numbers stay 2 bytes while
			// fewer than 32768 packets are unacknowledged, which quic-go's
			// 10000-packet congestion window bounds.
			ConnectionIDLength: datagramConnIDLen},
		links: map[string]*Link{},
		conns: map[*Conn]struct{}{},
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	tlsConf := opts.Identity.ServerConfig(func(err error) {
		e.handshake("accept", "rejected")
		opts.Log.Warn("rejected peer certificate", "err", err)
	})
	e.ln, err = e.tr.Listen(tlsConf, listenConfig(opts.MaxStreams))
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// datagramConnIDLen makes a packet with the largest datagram full-size.
const datagramConnIDLen = 17

// Addr is the bound UDP address.
func (e *Endpoint) Addr() net.Addr { return e.udp.LocalAddr() }

func (e *Endpoint) handshake(direction, result string) {
	e.opts.Metrics.Handshakes.WithLabelValues(e.opts.Name, direction, result).Inc()
}

func (e *Endpoint) accept() {
	defer e.wg.Done()
	for {
		qc, err := e.ln.Accept(e.ctx)
		if err != nil {
			return
		}
		peer, err := pki.PeerName(qc.ConnectionState().TLS)
		if err == nil && !e.opts.KnownPeer(peer) {
			err = fmt.Errorf("relay %q is in no manifest this relay knows", peer)
		}
		if err != nil {
			e.handshake("accept", "rejected")
			e.opts.Log.Warn("rejected peer", "remote", qc.RemoteAddr(), "err", err)
			qc.CloseWithError(1, "unknown relay")
			continue
		}
		e.handshake("accept", "ok")
		c := newConn(qc, peer)
		if !e.track(c) {
			qc.CloseWithError(0, "relay shutting down")
			return
		}
		e.opts.Log.Debug("peer connected", "peer", peer, "remote", qc.RemoteAddr())
		e.wg.Add(2)
		go func() {
			defer e.wg.Done()
			c.runDatagrams(e.dropped, e.echo)
		}()
		go func() {
			defer e.wg.Done()
			// Untrack only once the connection is gone, so Close, which
			// closes every tracked connection, cannot miss one.
			defer e.untrack(c)
			for {
				s, err := qc.AcceptStream(qc.Context())
				if err != nil {
					return
				}
				go e.opts.Handler(c, s)
			}
		}()
	}
}

func (e *Endpoint) echo(peer string, payload []byte) {
	if e.opts.OnProbeEcho != nil {
		e.opts.OnProbeEcho(peer, payload)
	}
}

func (e *Endpoint) dropped(reason string) {
	e.opts.Metrics.UDPDropped.WithLabelValues(e.opts.Name, "", reason).Inc()
}

func (e *Endpoint) track(c *Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return false
	}
	e.conns[c] = struct{}{}
	return true
}

func (e *Endpoint) untrack(c *Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// Link returns the link to a peer, creating it (and starting to dial) on
// first use.
func (e *Endpoint) Link(peer string, addrs []string) *Link {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l := e.links[peer]; l != nil {
		return l
	}
	l := newLink(e, peer, addrs)
	e.links[peer] = l
	if e.ctx.Err() == nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			l.run()
		}()
	}
	return l
}

// Live returns the connection to a peer this endpoint dials, if it is up
// now; it neither creates a link nor waits.
func (e *Endpoint) Live(peer string) *Conn {
	e.mu.Lock()
	l := e.links[peer]
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Live()
}

// Close ends every connection and stops the endpoint.
func (e *Endpoint) Close() error {
	e.cancel()
	err := e.ln.Close()
	e.mu.Lock()
	conns := make([]*Conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.CloseWithError(0, "relay shutting down")
	}
	e.wg.Wait()
	err = errors.Join(err, e.tr.Close())
	return errors.Join(err, e.udp.Close())
}
