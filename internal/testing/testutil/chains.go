package testutil

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TunnelSpec is a Tunnel of a LoopbackChain, listening on its Host:Port.
type TunnelSpec struct {
	Name, Protocol, Target string
	Port                   int
	Extra                  string // more of its spec, as ", udp: {mode: stream}"
	ListenExtra            string // more of its spec.listen, as ", allowedSources: [10.0.0.0/8]"
}

// LoopbackChain is the manifests of a test network on loopback: relays
// r0..r(Relays-1), a Chain c along Route, and its Tunnels.
type LoopbackChain struct {
	Relays    int
	Route     []string
	Transport string // the Chain's transport; quic when empty
	Tunnels   []TunnelSpec
	// Ports and Endpoints set a relay's listen port and the endpoint it
	// is dialed at, for a proxy in front of it; free ports otherwise.
	Ports     map[string]int
	Endpoints map[string]string
	// Host is the loopback address relays and Tunnels listen on and
	// relays are dialed at: 127.0.0.1 when empty, ::1 for IPv6.
	Host string
}

// Manifests writes c as YAML.
func (c LoopbackChain) Manifests(t testing.TB) string {
	t.Helper()
	host := c.Host
	if host == "" {
		host = "127.0.0.1"
	}
	var b strings.Builder
	for i := range c.Relays {
		name := fmt.Sprintf("r%d", i)
		p := c.Ports[name]
		if p == 0 {
			p = FreePort(t)
		}
		endpoint := c.Endpoints[name]
		if endpoint == "" {
			endpoint = net.JoinHostPort(host, strconv.Itoa(p))
		}
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: %q, port: %d}, endpoints: [%q]}\n", name, host, p, endpoint)
	}
	via := ""
	if len(c.Route) > 2 {
		via = "via: [" + strings.Join(c.Route[1:len(c.Route)-1], ", ") + "], "
	}
	transport := c.Transport
	if transport == "" {
		transport = "quic"
	}
	fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: %s, exit: %s, %sroute: [%s], transport: %s}\n",
		c.Route[0], c.Route[len(c.Route)-1], via, strings.Join(c.Route, ", "), transport)
	for _, tn := range c.Tunnels {
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\nspec: {chain: c, protocol: %s, listen: {address: %q, port: %d%s}, target: %q %s}\n",
			tn.Name, tn.Protocol, host, tn.Port, tn.ListenExtra, tn.Target, tn.Extra)
	}
	return b.String()
}

// DialTunnel connects to a Tunnel's listener on loopback; the connection
// gives up after a minute, so that a test that hangs on it ends.
// DialRefusable dials a Tunnel's entry that may refuse the flow: nil when
// the entry's reset arrived before the dial returned (the kernel completes
// the handshake, and a relay that refuses at once can reset it before the
// dialer has checked the connection), else the connection, as DialTunnel.
func DialRefusable(t testing.TB, port int) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c.(*net.TCPConn)
}

func DialTunnel(t testing.TB, port int) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c.(*net.TCPConn)
}
