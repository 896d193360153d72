package quic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/ratelog"
)

// Options configure an Endpoint.
type Options struct {
	// Name of this relay; the metrics' relay label.
	Name     string
	Identity *pki.Identity
	// Listen is the UDP host:port for QUIC; peers are dialed from the same
	// socket.
	Listen string
	// SeparateDialPort dials links from a UDP socket of their own, on a
	// port the kernel picks, instead of the relay port. A relay in a pod
	// network behind its node's SNAT needs it: dialing from the relay port,
	// it shows up at the node's address with that port, the very address
	// of a host-network relay on that node, and the NAT then hands that
	// relay's incoming connections to the pod. Off, a relay dials from its
	// relay port, as peers and link emulators that key on it expect.
	SeparateDialPort bool
	// NoDatagramChannel keeps UDP datagrams in QUIC (an older relay's
	// behaviour): the relay neither offers nor answers the channel.
	NoDatagramChannel bool
	// MaxStreams bounds the flows a peer may have open at once on one
	// connection (quic-go's MaxIncomingStreams), not on all of them: a peer
	// may hold several connections (Peers). 0 means DefaultMaxStreams.
	MaxStreams int64
	// Peers are the relays that may connect, each with the connections it
	// may hold to this relay (it dialed them; past them the idlest closes,
	// Endpoint.bound), 0 meaning DefaultMaxConns. A peer with a valid
	// certificate that is not among them is turned away. SetPeers replaces
	// them.
	Peers map[string]int
	// Upper takes the streams peers open and hears what the endpoint
	// learns of them.
	Upper   Upper
	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// Endpoint is a relay's QUIC side: it accepts peers and dials them.
type Endpoint struct {
	opts Options
	warn *ratelog.Logger // for what peers can make the relay log
	udp  *net.UDPConn
	// dialUDP and dialTr carry the connections this relay dials: udp and
	// tr themselves unless SeparateDialPort.
	dialUDP *net.UDPConn
	dialTr  *quicgo.Transport
	tr      *quicgo.Transport
	ln      *quicgo.Listener
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	links    *Links   // the connections it dials
	accepted accepted // the connections peers dialed

	mu sync.Mutex
	// drainers holds the connections on which a peer said it drains, by
	// peer, while they last: a peer that restarts connects anew. Only its
	// links count (drainNotice).
	drainers map[string][]*Conn

	peers map[string]int // who may connect (Options.Peers); under mu

	draining atomic.Bool // this relay drains
	red      *redundancy // where lone packets go twice

	// The sockets as the channels send on them (nil where their reader
	// cannot take the channel's packets out), and the channels.
	lossy, dialLossy *lossyConn
	channels         channels
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
	handshakes := rate.NewLimiter(handshakeRate, 2*handshakeRate)
	resetKey, err := opts.Identity.DeriveKey("stateless reset")
	if err != nil {
		udp.Close()
		return nil, err
	}
	dialUDP := udp
	if opts.SeparateDialPort {
		if dialUDP, err = net.ListenUDP("udp", &net.UDPAddr{IP: addr.IP, Zone: addr.Zone}); err != nil {
			udp.Close()
			return nil, fmt.Errorf("relay dial socket: %w", err)
		}
	}
	copies := opts.Metrics.RedundantCopies.WithLabelValues(opts.Name)
	red := newRedundancy(func(addr netip.AddrPort, on bool, loss float64) {
		if on {
			opts.Log.Info("link loses packets: lone packets go twice", "remote", addr, "loss", fmt.Sprintf("%.2f%%", 100*loss))
		} else {
			opts.Log.Info("lone packets go once again", "remote", addr)
		}
	}, copies.Inc)
	e := &Endpoint{
		opts:    opts,
		peers:   opts.Peers,
		udp:     udp,
		dialUDP: dialUDP,
		red:     red,
	}
	transport := func(c *net.UDPConn, channelOut **lossyConn) *quicgo.Transport {
		conn := newLossyConn(c, red, func(reason string) {
			opts.Metrics.SendLost.WithLabelValues(opts.Name, reason).Inc()
		})
		pc := withGRO(conn)
		if g, ok := pc.(*groConn); ok && !opts.NoDatagramChannel {
			g.channel = func(b []byte) { e.channels.packet(e, b) }
			*channelOut = conn
		}
		return &quicgo.Transport{Conn: pc, StatelessResetKey: (*quicgo.StatelessResetKey)(&resetKey),
			// quic-go takes datagrams of up to path MTU - 37 bytes. A
			// packet carrying one (1 byte flags, the connection ID, a
			// 2-byte packet number, 1 byte frame type, 16 bytes AEAD tag)
			// is exactly full with 17-byte IDs: with the default 4 it is
			// 13 bytes short, and a short packet ends a GSO batch, one
			// sendmsg per datagram. Packet numbers stay 2 bytes while
			// fewer than 32768 packets are unacknowledged, which quic-go's
			// 10000-packet congestion window bounds.
			ConnectionIDLength: datagramConnIDLen}
	}
	e.tr = transport(udp, &e.lossy)
	if !opts.SeparateDialPort {
		e.dialLossy = e.lossy
	}
	e.links = &Links{e: e, links: map[linkKey]*Link{}}
	// Past a rate of new connections, a client must prove its address (a
	// Retry, one round trip) before any handshake work: a flood of spoofed
	// Initials costs little.
	e.tr.VerifySourceAddress = func(net.Addr) bool { return !handshakes.Allow() }
	e.dialTr = e.tr
	if opts.SeparateDialPort {
		e.dialTr = transport(dialUDP, &e.dialLossy)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.warn = ratelog.New(opts.Log)
	tlsConf := opts.Identity.ServerConfig(func(remote net.Addr, err error) {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected peer certificate", "remote", remote, "err", err)
		e.event(Event{Kind: Rejected, Remote: remote, Err: err})
	})
	e.ln, err = e.tr.Listen(tlsConf, listenConfig(opts.MaxStreams))
	if err != nil {
		udp.Close()
		if dialUDP != udp {
			dialUDP.Close()
		}
		return nil, fmt.Errorf("relay listen: %w", err)
	}
	e.reportBuffers()
	e.wg.Add(2)
	go e.accept()
	go e.judgeLoss()
	return e, nil
}

// reportBuffers exports the socket buffers quic-go obtained (it asks for
// 7 MiB; a relay without CAP_NET_ADMIN gets what the node's
// net.core.rmem_max and wmem_max allow, and a small receive buffer drops
// datagrams in bursts).
func (e *Endpoint) reportBuffers() {
	raw, err := e.udp.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		for dir, opt := range map[string]int{"receive": unix.SO_RCVBUF, "send": unix.SO_SNDBUF} {
			if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt); err == nil {
				e.opts.Metrics.UDPBuffer.WithLabelValues(e.opts.Name, dir).Set(float64(n))
			}
		}
	})
}

// handshakeRate is how many new connections a second a relay accepts
// without a Retry: far more than its peers ever make.
const handshakeRate = 100

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
		if err == nil && !e.known(peer) {
			err = fmt.Errorf("relay %q is in no manifest this relay knows", peer)
		}
		if err != nil {
			e.handshake("accept", "rejected")
			e.warn.Warn("rejected peer", "remote", qc.RemoteAddr(), "err", err)
			e.event(Event{Kind: Rejected, Remote: qc.RemoteAddr(), Err: err})
			qc.CloseWithError(1, "unknown relay")
			continue
		}
		e.handshake("accept", "ok")
		c := newConn(qc, peer, false)
		if !e.accepted.add(e.ctx, c) {
			qc.CloseWithError(0, "relay shutting down")
			return
		}
		if e.bound(c) {
			e.accepted.remove(c)
			continue
		}
		e.opts.Log.Debug("peer connected", "peer", peer, "remote", qc.RemoteAddr())
		e.wg.Add(2)
		go func() {
			defer e.wg.Done()
			c.runDatagrams(e)
		}()
		go func() {
			defer e.wg.Done()
			// Forget it only once the connection is gone, so Close, which
			// closes every accepted connection, cannot miss one.
			defer e.accepted.remove(c)
			for {
				s, err := qc.AcceptStream(qc.Context())
				if err != nil {
					return
				}
				c.serving.Add(1)
				c.touch()
				go func() {
					defer func() {
						c.touch()
						c.serving.Add(-1)
					}()
					e.serve(c, s)
				}()
			}
		}()
	}
}

// serve hands a stream a peer opened to the Upper; without one, nothing
// serves it.
func (e *Endpoint) serve(c *Conn, s *quicgo.Stream) {
	if e.opts.Upper == nil {
		s.CancelRead(quicgo.StreamErrorCode(hop.CodeRejected))
		s.CancelWrite(quicgo.StreamErrorCode(hop.CodeRejected))
		return
	}
	e.opts.Upper.Serve(c, s)
}

// allConns is every connection up now, accepted and dialed.
func (e *Endpoint) allConns() []*Conn {
	return append(e.accepted.list(), e.links.conns()...)
}

// Links are the connections this endpoint dials.
func (e *Endpoint) Links() *Links { return e.links }

func (e *Endpoint) dropped(reason string) {
	e.opts.Metrics.UDPDropped.WithLabelValues(e.opts.Name, "", reason).Inc()
}

// droppedN counts n datagrams a channel dropped for reason.
func (e *Endpoint) droppedN(reason string, n int) {
	e.opts.Metrics.UDPDropped.WithLabelValues(e.opts.Name, "", reason).Add(float64(n))
}

// copied counts a datagram a channel sent twice.
func (e *Endpoint) copied() { e.opts.Metrics.DatagramCopies.WithLabelValues(e.opts.Name).Inc() }

// channelSocket is the socket a connection's channel sends on, or nil
// where its reader does not take the channel's packets out (no UDP GRO).
func (e *Endpoint) channelSocket(dialed bool) *lossyConn {
	if dialed {
		return e.dialLossy
	}
	return e.lossy
}

// accepted is the connections peers dialed to this relay, while they last.
type accepted struct {
	mu    sync.Mutex
	conns map[*Conn]struct{}
}

// add counts c, unless ctx (the endpoint's) ended: Close, which closes
// every connection counted, could miss it then.
func (a *accepted) add(ctx context.Context, c *Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	if a.conns == nil {
		a.conns = map[*Conn]struct{}{}
	}
	a.conns[c] = struct{}{}
	return true
}

func (a *accepted) remove(c *Conn) {
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
}

func (a *accepted) list() []*Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	conns := make([]*Conn, 0, len(a.conns))
	for c := range a.conns {
		conns = append(conns, c)
	}
	return conns
}

// Close ends every connection and stops the endpoint.
func (e *Endpoint) Close() error {
	e.cancel()
	err := e.ln.Close()
	for _, c := range e.accepted.list() {
		c.CloseWithError(0, "relay shutting down")
	}
	e.wg.Wait()
	err = errors.Join(err, e.tr.Close())
	if e.dialTr != e.tr {
		err = errors.Join(err, e.dialTr.Close(), e.dialUDP.Close())
	}
	return errors.Join(err, e.udp.Close())
}
