package tlslink

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/flow"
)

// TestEndOfFlowNeedsCloseNotify: a hop's flow ends cleanly only on the
// peer's close_notify. A TCP end without one (the peer relay was killed, or
// something on the path sent a FIN) is a cut: the flow reads flow.ErrCut,
// not io.EOF, and so is reset at both applications instead of ending
// cleanly short of its bytes. crypto/tls alone reports both as io.EOF.
func TestEndOfFlowNeedsCloseNotify(t *testing.T) {
	a, b := twoIdentities(t)
	for _, tc := range []struct {
		name string
		end  func(c *tls.Conn, raw *net.TCPConn)
		want error
	}{
		{"close_notify", func(c *tls.Conn, _ *net.TCPConn) { c.CloseWrite() }, io.EOF},
		{"close_notify and close", func(c *tls.Conn, _ *net.TCPConn) { c.Close() }, io.EOF},
		{"FIN alone", func(_ *tls.Conn, raw *net.TCPConn) { raw.CloseWrite() }, flow.ErrCut},
		{"process gone", func(_ *tls.Conn, raw *net.TCPConn) { raw.Close() }, flow.ErrCut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, in := testutil.TCPPair(t)
			client := tls.Client(raw, a.ClientConfig("b"))
			server := tls.Server(wrap(in), b.ServerConfig(nil))
			defer server.Close()
			go func() {
				if client.Handshake() == nil {
					client.Write([]byte("some of the flow"))
					tc.end(client, raw)
				}
			}()
			server.SetDeadline(time.Now().Add(5 * time.Second))
			end := flow.TLS(server, func() {})
			got, err := io.ReadAll(end)
			if string(got) != "some of the flow" {
				t.Fatalf("read %q", got)
			}
			// io.ReadAll turns io.EOF into nil.
			if tc.want == io.EOF && err != nil || tc.want != io.EOF && !errors.Is(err, tc.want) {
				t.Fatalf("the flow ended with %v, want %v", err, tc.want)
			}
		})
	}
}

// twoIdentities is relays a and b under one new CA.
func twoIdentities(t *testing.T) (a, b *pki.Identity) {
	t.Helper()
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	if a, err = ca.Identity("a"); err != nil {
		t.Fatal(err)
	}
	if b, err = ca.Identity("b"); err != nil {
		t.Fatal(err)
	}
	return a, b
}
