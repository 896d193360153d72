package tlslink

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/srcaddr"
)

// connListener hands the admin server the connections that chose its
// protocol on the relay's TLS port.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// serveAdmin passes a connection to the admin server if the operator holds
// it; anyone else with a certificate of the CA is turned away.
func (e *Endpoint) serveAdmin(c *tls.Conn) {
	peer, err := pki.PeerName(c.ConnectionState())
	if err == nil && (e.admin == nil || !pki.AdminClient(peer)) {
		err = fmt.Errorf("%q may not use the admin API", peer)
	}
	if err != nil {
		e.handshake("accept", "rejected")
		e.warn.Warn("rejected admin client", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	e.handshake("accept", "ok")
	e.handshakes.learn(srcaddr.Of(c.RemoteAddr()), time.Now())
	select {
	// Wrapped, because net/http closes a *tls.Conn whose protocol (ours)
	// it has no TLSNextProto handler for; as a plain conn it speaks HTTP/1.1.
	case e.adminL.conns <- adminConn{Conn: c, client: peer}:
	case <-e.adminL.done:
		c.Close()
	}
}

type adminConn struct {
	net.Conn
	client string
}
