package linkemu

import (
	"errors"
	"net"
	"sync"
)

// UDPProxy forwards datagrams between the clients that send to its address
// and one target, through a shaped pipe in each direction. Each client gets
// its own socket toward the target, as a NAT would give it, so the target
// sees one peer per client.
type UDPProxy struct {
	ln     *net.UDPConn
	target *net.UDPAddr

	mu       sync.Mutex
	up, down Params
	clients  map[string][2]Params // per client address: up, down
	sessions map[string]*udpSession
	closed   bool
}

type udpSession struct {
	conn     *net.UDPConn // to the target
	up, down *pipe
}

// NewUDPProxy listens on listen (e.g. 127.0.0.1:0) and forwards to target;
// p shapes both directions.
func NewUDPProxy(listen, target string, p Params) (*UDPProxy, error) {
	la, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, err
	}
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUDP("udp", la)
	if err != nil {
		return nil, err
	}
	ln.SetReadBuffer(4 << 20)
	u := &UDPProxy{ln: ln, target: ta, up: p, down: p, sessions: map[string]*udpSession{}}
	go u.serve()
	return u, nil
}

// Addr is where clients send.
func (u *UDPProxy) Addr() string { return u.ln.LocalAddr().String() }

// Set changes both directions at once, for packets that arrive from now on.
func (u *UDPProxy) Set(p Params) { u.SetDirections(p, p) }

// SetDirections shapes client-to-target (up) and target-to-client (down).
func (u *UDPProxy) SetDirections(up, down Params) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.up, u.down = up, down
	for client, s := range u.sessions {
		if _, own := u.clients[client]; !own {
			s.up.s.set(up)
			s.down.s.set(down)
		}
	}
}

// SetFrom shapes the traffic of one client address (host:port) apart from
// the others: with one relay's port per client, a proxy in front of a relay
// then emulates a different link from each of its peers.
func (u *UDPProxy) SetFrom(client string, up, down Params) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.clients == nil {
		u.clients = map[string][2]Params{}
	}
	u.clients[client] = [2]Params{up, down}
	if s := u.sessions[client]; s != nil {
		s.up.s.set(up)
		s.down.s.set(down)
	}
}

// Close stops forwarding.
func (u *UDPProxy) Close() error {
	u.mu.Lock()
	u.closed = true
	sessions := u.sessions
	u.sessions = nil
	u.mu.Unlock()
	err := u.ln.Close()
	for _, s := range sessions {
		s.conn.Close()
		s.up.close()
		s.down.close()
	}
	return err
}

func (u *UDPProxy) serve() {
	buf := make([]byte, 65536)
	for {
		n, from, err := u.ln.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if s := u.session(from); s != nil {
			s.up.push(buf[:n])
		}
	}
}

func (u *UDPProxy) session(from *net.UDPAddr) *udpSession {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil
	}
	if s := u.sessions[from.String()]; s != nil {
		return s
	}
	c, err := net.DialUDP("udp", nil, u.target)
	if err != nil {
		return nil
	}
	c.SetReadBuffer(4 << 20)
	up, down := u.up, u.down
	if p, ok := u.clients[from.String()]; ok {
		up, down = p[0], p[1]
	}
	s := &udpSession{conn: c}
	s.up = newPipe(up, func(b []byte) { c.Write(b) })
	s.down = newPipe(down, func(b []byte) { u.ln.WriteToUDP(b, from) })
	u.sessions[from.String()] = s
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := c.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				// An ICMP error from the target (say, port unreachable
				// while it starts) is transient, as on a real path: keep
				// the session, or its client could never get through.
				continue
			}
			s.down.push(buf[:n])
		}
	}()
	return s
}
