// Package tlslink carries TCP flows between relays over TLS 1.3 on TCP, one
// connection per flow. It exists for bulk transfer on clean links: there the
// kernel's TCP offloads move 64 KiB segments where QUIC moves 1.4 KB UDP
// packets, one system call path each. So that a flow still costs no
// handshake, every peer has a pool of connections handshaken in advance.
// Authentication is the same as QUIC's: the CA, and a relay name that the
// manifests know.
package tlslink

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/ratelog"
)

const (
	handshakeTimeout = 5 * time.Second
	// A spare lives at most this long in a pool; the listener waits a
	// little longer than that for a connection's header.
	spareMaxAge   = 30 * time.Second
	headerTimeout = spareMaxAge + 15*time.Second
	// A spare is renewed in the last renewAhead-th of its life (5 s of
	// 30). Spares above the base were made one at a time, refillPace
	// apart, and are renewed so; a pool whose oldest spare has half of
	// that left renews without the pace, refillParallel at once. A pool
	// with nothing to renew looks again after idleCheck.
	renewAhead = 6
	idleCheck  = 5 * time.Second
	// DefaultSpares is how many handshaken connections a pool keeps ready.
	DefaultSpares = 8
	// refillParallel bounds concurrent handshakes of one pool refilling.
	refillParallel = 4
	// MaxHandshakes bounds the handshakes a listener runs at once: before
	// a client has proved who it is, it must not cost the relay without
	// bound. Past it, the oldest handshake of the source holding the most
	// is closed to make room, never a known source's for an unknown one
	// (handshakes); each closed is counted as a failed accept.
	MaxHandshakes = 128
	// MaxHandshakesPerSource bounds those from one source (an IPv4
	// address, an IPv6 /64): a relay's pools to this peer dial at most
	// poolDials at once, and several relays may share a host.
	MaxHandshakesPerSource = 64
	poolDials              = 16
	minBackoff             = 100 * time.Millisecond
	maxBackoff             = 5 * time.Second
)

const (
	// MaxWaitingPerPeer and MaxWaiting bound the connections, of one peer
	// and in all, that are handshaken and have not yet started a flow.
	// Pools keep spares so, idle for up to spareMaxAge: DefaultSpares per
	// pool, a pool per replica of a peer, or more after a burst, maxSpares
	// for all of a relay's pools to one peer, three quarters of a peer's
	// share here. Past a bound the oldest waiting connection of the peer
	// (or, past MaxWaiting, of the peer that holds the most) is closed
	// rather than the new one refused: a new spare is the one its pool
	// holds and will hand out next, the oldest is nearest retirement or
	// already forgotten (a peer gone without a FIN), and a peer that floods
	// the listener only recycles its own connections, never another's.
	//
	// A waiting connection costs the listener about 20 KiB (its TLS state
	// and the goroutine reading its header) and its pool about 12 KiB: at
	// most 10 MiB for one peer here, 20 MiB in all. 512 lets a relay keep
	// 384 spares to a peer, enough for 300 clients that arrive within
	// 50 ms; with 256 (192 spares) a third of them rode QUIC, each request
	// slower. One peer may so hold half of MaxWaiting: past it, the peer
	// that holds the most gives up its oldest.
	MaxWaitingPerPeer = 512
	MaxWaiting        = 1024
)

// Options configure an Endpoint.
type Options struct {
	Name     string
	Identity *pki.Identity
	// Listen is the TCP host:port; relays use their QUIC port number.
	Listen string
	// Peers are the relays that may connect; a peer with a valid
	// certificate that is not among them is turned away. SetPeers
	// replaces them.
	Peers []string
	// Congestion is the TCP congestion control of the links this endpoint
	// dials and accepts (ChooseCongestion).
	Congestion Congestion
	// Upper takes the connections peers open and hears of the handshakes
	// refused.
	Upper Upper
	// Admin, when set, serves the admin API to the operator: connections
	// that negotiate pki.AdminALPN with the operator's certificate.
	Admin   http.Handler
	Spares  int
	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// Upper is the layer above an Endpoint, its one way in.
type Upper interface {
	// Serve serves an authenticated connection whose read deadline bounds
	// the wait for the flow's header, and calls Endpoint.Started once it
	// has read the header: until then the connection may be closed to make
	// room for others (MaxWaitingPerPeer). It owns the connection.
	Serve(peer string, c *tls.Conn)
	// Rejected hears of a peer handshake refused.
	Rejected(remote net.Addr, err error)
}

// Endpoint accepts and dials TLS links for one relay.
type Endpoint struct {
	opts   Options
	warn   *ratelog.Logger // for what peers can make the relay log
	ln     net.Listener
	admin  *http.Server
	adminL *connListener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// serverConf is the listener's TLS config; its session ticket keys
	// change when the CAs do, so no session of the old trust resumes.
	serverConf *tls.Config
	cc         ccSetting // the links' congestion control

	pools    *Pools        // the connections it dials
	spareAge time.Duration // spareMaxAge; tests take less
	// maxAllSpares (MaxAllSpares; tests take less) bounds the spares of
	// all pools above their base.
	maxAllSpares int
	handshakes   *handshakes // those it accepts, before they are authenticated
	waiting      waiting     // ... and after, until their flow starts

	mu     sync.Mutex
	peers  map[string]bool        // who may connect (Options.Peers)
	active map[*tls.Conn]struct{} // connections carrying flows, closed by Close
}

// Listen binds the TCP listener and starts accepting peers.
func Listen(opts Options) (*Endpoint, error) {
	if opts.Spares <= 0 {
		opts.Spares = DefaultSpares
	}
	e := &Endpoint{opts: opts, warn: ratelog.New(opts.Log), active: map[*tls.Conn]struct{}{},
		handshakes: newHandshakes(MaxHandshakes, MaxHandshakesPerSource),
		waiting:    waiting{max: MaxWaiting, perPeer: MaxWaitingPerPeer}, spareAge: spareMaxAge, maxAllSpares: MaxAllSpares}
	e.pools = &Pools{e: e, pools: map[string]*Pool{}, trusted: opts.Identity.Roots()}
	e.SetPeers(opts.Peers)
	e.cc.store(opts.Congestion)
	lc := net.ListenConfig{Control: e.control}
	ln, err := lc.Listen(context.Background(), "tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay TLS listen: %w", err)
	}
	e.ln = ln
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if opts.Admin != nil {
		e.adminL = &connListener{addr: ln.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
		e.admin = &http.Server{Handler: opts.Admin, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
			// The handler admits each call by the name the client proved.
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				if ac, ok := c.(adminConn); ok {
					return adminapi.WithClient(ctx, ac.client)
				}
				return ctx
			}}
		go e.admin.Serve(e.adminL)
	}
	protos := []string{pki.ALPN}
	if e.opts.Admin != nil {
		protos = append(protos, pki.AdminALPN)
	}
	e.serverConf = e.opts.Identity.ServerConfig(func(remote net.Addr, err error) {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected peer certificate", "transport", "tls", "remote", remote, "err", err)
		e.rejected(remote, err)
	}, protos...)
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// Pools are the connections this endpoint dials.
func (e *Endpoint) Pools() *Pools { return e.pools }

// Addr is the bound TCP address.
func (e *Endpoint) Addr() net.Addr { return e.ln.Addr() }

func (e *Endpoint) handshake(direction, result string) {
	e.opts.Metrics.Handshakes.WithLabelValues(e.opts.Name, direction, result).Inc()
}

func (e *Endpoint) rejected(remote net.Addr, err error) {
	if e.opts.Upper != nil {
		e.opts.Upper.Rejected(remote, err)
	}
}

// Close stops accepting, closes every spare and waits for the pools.
func (e *Endpoint) Close() error {
	e.cancel()
	err := e.ln.Close()
	if e.admin != nil {
		e.adminL.Close()
		e.admin.Close()
	}
	e.wg.Wait()
	e.pools.drain()
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := range e.active {
		c.NetConn().Close() // ends the flow; its relay goroutines see the error
	}
	return err
}
