// Package quic carries flows between relays: one long-lived, mutually
// authenticated QUIC connection per peer, a stream per TCP flow or UDP
// session, and datagrams for UDP packets. It knows nothing of tunnels and
// chains; the relay hands it a stream handler.
package quic

import (
	"context"
	"os"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// Flow-control windows. A stream's window must cover the bandwidth-delay
// product of the path or one flow cannot fill it: 16 MiB carries 1 Gbit/s
// over 130 ms. The connection window bounds what one peer can make us
// buffer across all its streams. quic-go grows windows from the initial
// value as the peer proves it needs them, so idle flows cost nothing.
const (
	initialStreamWindow = 256 << 10
	maxStreamWindow     = 16 << 20
	initialConnWindow   = 64 << 20
	maxConnWindow       = 64 << 20
)

// Timers. A keepalive every second keeps NAT bindings and lets an idle
// timeout of 3 s (three lost keepalives; quic-go never times out before
// three probe timeouts, so a slow path gets longer) notice a peer that
// vanished without closing within about one and a half probe intervals:
// its open flows end then instead of hanging, and new ones fail at once
// (Link.down). A peer that restarts is noticed at once, by stateless
// reset.
const (
	keepAlive        = time.Second
	idleTimeout      = 3 * time.Second
	handshakeTimeout = 5 * time.Second
)

// DefaultMaxStreams bounds the streams (flows) one peer may have open on one
// connection at a time.
const DefaultMaxStreams = 1 << 16

func baseConfig() *quicgo.Config {
	return &quicgo.Config{
		HandshakeIdleTimeout:           handshakeTimeout,
		MaxIdleTimeout:                 idleTimeout,
		KeepAlivePeriod:                keepAlive,
		InitialStreamReceiveWindow:     initialStreamWindow,
		MaxStreamReceiveWindow:         maxStreamWindow,
		InitialConnectionReceiveWindow: initialConnWindow,
		MaxConnectionReceiveWindow:     maxConnWindow,
		MaxIncomingUniStreams:          -1,
		EnableDatagrams:                true,
		Tracer:                         qlogTracer(),
	}
}

// qlogTracer writes quic-go's qlog traces into $QLOGDIR when it is set, as
// quic-go's own tools do: where datagrams were dropped and why, packet by
// packet. For debugging only; it costs CPU and disk.
func qlogTracer() func(context.Context, bool, quicgo.ConnectionID) qlogwriter.Trace {
	if os.Getenv("QLOGDIR") == "" {
		return nil
	}
	return qlog.DefaultConnectionTracer
}

// listenConfig accepts streams from peers that dialed us.
func listenConfig(maxStreams int64) *quicgo.Config {
	c := baseConfig()
	c.MaxIncomingStreams = maxStreams
	return c
}

// dialConfig refuses streams on connections we dialed: a flow always travels
// from dialer to listener, so a listener never gets to open one toward us.
func dialConfig() *quicgo.Config {
	c := baseConfig()
	c.MaxIncomingStreams = -1
	return c
}
