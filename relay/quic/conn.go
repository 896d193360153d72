package quic

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/time/rate"

	"github.com/hoplink/hoplink/relay/hop"
)

// Conn is an authenticated connection to a peer relay.
type Conn struct {
	*quicgo.Conn
	// Peer is the relay name of the other end, from its certificate.
	Peer string
	// draining: the peer said it drains (hop.DrainFlow) on this connection.
	draining atomic.Bool
	// dialed: this relay dialed the connection, to an endpoint of its
	// choosing. admitted: the relay admitted a stream of the peer's on it.
	// Only such a connection is the peer's link, whose drain news counts
	// for the peer beyond the connection (Endpoint.drainNotice); heard is
	// what became of that news here (heardIgnored, heardHonoured).
	dialed   bool
	admitted atomic.Bool
	heard    atomic.Uint32
	// For the bound on a peer's connections (Endpoint.bound), on a
	// connection the peer dialed: the streams being served now, when one
	// last started or ended or a probe was answered (unix nanos), and
	// whether a probe ever was.
	serving    atomic.Int64
	lastActive atomic.Int64
	probed     atomic.Bool
	// flows counts this relay's TCP flows on the connection (Hold); once
	// the peer said it is done (hop.DoneFlow) the last one to end closes
	// the connection, which tells the peer that all it sent was read.
	flows    atomic.Int64
	peerDone atomic.Bool
	// reported is the sent count of the last report (counts.go); peerLost
	// the most packets the peer said it had not received.
	reported uint64
	peerLost atomic.Uint64

	// channel carries UDP datagrams beside QUIC once both ends speak it
	// (dgram.go); nil where the socket cannot take its packets out.
	channel atomic.Pointer[dgChannel]
	// echoes bounds the probes and count reports answered.
	echoes *rate.Limiter

	mu      sync.Mutex
	sinks   map[uint64]func([]byte)
	pending map[uint64]*pendingFlow
}

// A UDP session's first datagram can overtake the stream frame that
// announces the session (they may share a packet, and two goroutines read
// them), so datagrams for a flow id not yet registered wait briefly. Both
// the wait and the amount held are bounded.
const (
	maxPendingFlows   = 64
	maxPendingPackets = 8
	pendingTTL        = 2 * time.Second
)

// maxEchoRate bounds the link probes a relay answers on one connection, per
// second; a prober sends a few per round.
const maxEchoRate = 200

type pendingFlow struct {
	since   time.Time
	packets [][]byte
}

func newConn(c *quicgo.Conn, peer string, dialed bool) *Conn {
	conn := &Conn{Conn: c, Peer: peer, dialed: dialed, sinks: map[uint64]func([]byte){}, pending: map[uint64]*pendingFlow{},
		// Echoes are cheap, but a peer must not make us send without bound.
		echoes: rate.NewLimiter(maxEchoRate, maxEchoRate/2)}
	conn.touch()
	return conn
}

func (c *Conn) touch() { c.lastActive.Store(time.Now().UnixNano()) }

// idleness is what decides which of a peer's connections closes first
// when it holds too many (Endpoint.bound), read once.
type idleness struct {
	c    *Conn
	busy bool  // it serves a stream
	used bool  // it carried an admitted stream or answered a probe, as the peer's links do
	last int64 // when it was last active, unix nanos
}

func (c *Conn) idleness() idleness {
	return idleness{c: c, busy: c.serving.Load() > 0, used: c.admitted.Load() || c.probed.Load(), last: c.lastActive.Load()}
}

// rank puts a connection the peer never used before one it used, and
// both before one serving a stream.
func (a idleness) rank() int {
	switch {
	case a.busy:
		return 2
	case a.used:
		return 1
	}
	return 0
}

// closesBefore orders a peer's connections for closing: by rank, then the
// one idle longer first.
func (a idleness) closesBefore(b idleness) int {
	return cmp.Or(cmp.Compare(a.rank(), b.rank()), cmp.Compare(a.last, b.last))
}

// Register routes datagrams of flow id to sink, first handing it any that
// arrived early. sink runs on the connection's datagram goroutine and must
// not block for long.
func (c *Conn) Register(id uint64, sink func([]byte)) {
	c.mu.Lock()
	c.sinks[id] = sink
	p := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if p != nil {
		for _, pkt := range p.packets {
			sink(pkt)
		}
	}
}

// Unregister stops routing datagrams of flow id.
func (c *Conn) Unregister(id uint64) {
	c.mu.Lock()
	delete(c.sinks, id)
	c.mu.Unlock()
}

// oversize is larger than any datagram a connection takes: offered one,
// quic-go reports its current limit and sends nothing.
var oversize = make([]byte, 1<<16)

// MaxDatagram is the largest datagram payload the connection takes now; it
// grows as path MTU discovery does.
func (c *Conn) MaxDatagram() int {
	var tooLarge *quicgo.DatagramTooLargeError
	if err := c.SendDatagram(oversize); errors.As(err, &tooLarge) {
		return int(tooLarge.MaxDatagramPayloadSize)
	}
	return 0
}

// SendFlowDatagram sends one UDP packet of flow id: on the connection's
// channel once it runs, else as a QUIC datagram.
func (c *Conn) SendFlowDatagram(id uint64, payload []byte) error {
	return c.sendFlowDatagram(id, nil, payload)
}

// sendFlowDatagram is SendFlowDatagram for a session with a Share (may
// be nil).
func (c *Conn) sendFlowDatagram(id uint64, sh *Share, payload []byte) error {
	if ch := c.channel.Load(); ch.usable() {
		return ch.send(id, sh, payload)
	}
	return c.sendQUICDatagram(id, payload)
}

func (c *Conn) sendQUICDatagram(id uint64, payload []byte) error {
	var buf [2048]byte
	if len(payload)+8 > len(buf) {
		return c.SendDatagram(hop.AppendDatagram(nil, id, payload))
	}
	return c.SendDatagram(hop.AppendDatagram(buf[:0], id, payload))
}

// Hold counts a TCP flow on the connection until release, which may be
// called more than once.
func (c *Conn) Hold() (release func()) {
	c.flows.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			if c.flows.Add(-1) == 0 && c.peerDone.Load() {
				c.CloseWithError(0, "peer drained")
			}
		})
	}
}

// Draining reports whether the peer said, on this connection, that it
// takes no new flows.
func (c *Conn) Draining() bool { return c.draining.Load() }

// Admitted records that the relay admitted a stream the peer opened on the
// connection (its header passed the manifests): the connection is then one
// of the peer's links, not merely one made with its certificate.
func (c *Conn) Admitted() { c.admitted.Store(true) }

// runDatagrams dispatches QUIC datagrams until the connection ends (see
// deliver), after starting the connection's datagram channel.
func (c *Conn) runDatagrams(e *Endpoint) {
	c.startChannel(e)
	ctx := c.Context()
	for {
		d, err := c.ReceiveDatagram(ctx)
		if err != nil {
			return
		}
		id, payload, err := hop.ParseDatagram(d)
		if err != nil {
			e.dropped("bad_datagram")
			continue
		}
		c.deliver(e, id, payload)
	}
}

// deliver dispatches one datagram: UDP packets to their session's sink,
// link probes back to the peer (or, while e drains, the news that it
// does), probe echoes and a peer's drain to e. Datagrams it cannot route
// are counted as dropped. The QUIC datagram goroutine and the socket's
// reader (the channel's) call it.
func (c *Conn) deliver(e *Endpoint, id uint64, payload []byte) {
	onDrop := e.dropped
	switch id {
	case hop.ProbeFlow:
		switch {
		case len(payload) > hop.MaxProbe || !c.echoes.Allow():
			onDrop("probe_limit")
		case e.draining.Load():
			c.SendDatagram(hop.AppendDatagram(nil, hop.DrainFlow, nil))
		default:
			c.SendDatagram(hop.AppendDatagram(nil, hop.ProbeEchoFlow, payload))
			c.probed.Store(true)
			c.touch()
		}
		return
	case hop.ProbeEchoFlow:
		e.event(Event{Kind: ProbeEcho, Peer: c.Peer, Payload: payload})
		return
	case hop.CountFlow:
		if !c.echoes.Allow() {
			onDrop("probe_limit")
		} else if c.answerCounts(payload) != nil {
			onDrop("bad_datagram")
		}
		return
	case hop.CountEchoFlow:
		if c.peerCounts(payload) != nil {
			onDrop("bad_datagram")
		}
		return
	case hop.DrainFlow:
		c.draining.Store(true)
		e.drainNotice(c)
		return
	case hop.DoneFlow:
		// A peer that is done drained first, so this closes at most
		// once its flows here end; it waits for the close to exit.
		// That much any connection may ask for itself.
		c.draining.Store(true)
		e.drainNotice(c)
		c.peerDone.Store(true)
		if c.flows.Load() == 0 {
			c.CloseWithError(0, "peer drained")
		}
		return
	}
	c.mu.Lock()
	sink := c.sinks[id]
	if sink == nil {
		ok := c.holdLocked(id, payload)
		c.mu.Unlock()
		if !ok {
			onDrop("no_session")
		}
		return
	}
	c.mu.Unlock()
	sink(payload)
}

func (c *Conn) holdLocked(id uint64, payload []byte) bool {
	now := time.Now()
	for k, p := range c.pending {
		if now.Sub(p.since) > pendingTTL {
			delete(c.pending, k)
		}
	}
	p := c.pending[id]
	if p == nil {
		if len(c.pending) >= maxPendingFlows {
			return false
		}
		p = &pendingFlow{since: now}
		c.pending[id] = p
	}
	if len(p.packets) >= maxPendingPackets {
		return false
	}
	p.packets = append(p.packets, payload)
	return true
}

// SendProbe sends a link probe; the peer answers it with the same payload,
// which arrives at the endpoint's Upper as a ProbeEcho.
func (c *Conn) SendProbe(payload []byte) error {
	return c.SendDatagram(hop.AppendDatagram(nil, hop.ProbeFlow, payload))
}

// OpenFlow opens a stream for a new flow, waiting at most until ctx ends if
// the peer's stream limit is reached.
func (c *Conn) OpenFlow(ctx context.Context) (*quicgo.Stream, error) {
	return c.OpenStreamSync(ctx)
}

// SmoothedRTT is QUIC's own RTT estimate of the connection.
func (c *Conn) SmoothedRTT() time.Duration { return c.ConnectionStats().SmoothedRTT }
