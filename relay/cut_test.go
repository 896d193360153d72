package relay_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/relay"
)

// TestCutHopIsAResetNotAnEnd: something between two relays ends a TLS
// hop's TCP connection with a FIN and no TLS close_notify, as a middlebox
// or the kernel of a relay that died does, part way through a flow. The
// application on the far side of the cut must see a reset, never a clean
// end of a stream short of its bytes; before, the relay read the FIN as
// the flow's end and passed it on as one.
func TestCutHopIsAResetNotAnEnd(t *testing.T) {
	const size, cutAfter = 4 << 20, 1 << 20
	pattern := func() []byte { b := make([]byte, size); testutil.RandReader(7, size).Read(b); return b }()
	for _, dir := range []string{"download", "upload"} {
		t.Run(dir, func(t *testing.T) {
			// The target sends the pattern (download), or reads until the
			// flow ends and says how it ended (upload).
			ended := make(chan error, 1)
			target := testutil.TCPServer(t, func(c *net.TCPConn) {
				if dir == "download" {
					c.Write(pattern)
					c.CloseWrite()
					io.Copy(io.Discard, c)
					return
				}
				c.SetReadDeadline(time.Now().Add(20 * time.Second))
				_, err := io.Copy(io.Discard, c)
				ended <- err
			})
			exitPort, port := testutil.FreePort(t), testutil.FreePort(t)
			exitAddr := fmt.Sprintf("127.0.0.1:%d", exitPort)
			// The exit's endpoint is a proxy: TCP through one that cuts, UDP
			// (QUIC: the relays' control link) straight through.
			cut := newCutProxy(t, exitAddr, dir == "download", cutAfter)
			udp, err := linkemu.NewUDPProxy(cut.ln.Addr().String(), exitAddr, linkemu.Params{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { udp.Close() })
			_, m, _ := startLoopback(t, relay.Config{}, testutil.LoopbackChain{Relays: 2, Route: []string{"r0", "r1"}, Transport: "tls",
				Tunnels: []testutil.TunnelSpec{{Name: "t", Protocol: "tcp", Target: target, Port: port}},
				Ports:   map[string]int{"r1": exitPort}, Endpoints: map[string]string{"r1": cut.ln.Addr().String()}})

			c := testutil.DialTunnel(t, port)
			defer c.Close()
			// Each relay counts the flow's end under the side that failed:
			// the hop between them.
			defer func() {
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					entry := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r0", "default/t", "next_hop_reset"))
					exit := promtest.ToFloat64(m.FlowErrors.WithLabelValues("r1", "default/t", "prev_hop_reset"))
					if entry == 1 && exit == 1 {
						return
					}
					if time.Now().After(deadline) {
						t.Errorf("flow errors: next_hop_reset at the entry %v, prev_hop_reset at the exit %v; want 1 and 1", entry, exit)
						return
					}
				}
			}()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			if dir == "download" {
				got, err := io.ReadAll(c)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("the client read %d of %d bytes, then %v; want a reset", len(got), size, err)
				}
				if !bytes.Equal(got, pattern[:len(got)]) {
					t.Fatal("a byte the client read differs from what the target sent")
				}
				return
			}
			go func() {
				c.Write(pattern)
				c.CloseWrite()
			}()
			select {
			case err := <-ended:
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("the target saw the upload end with %v; want a reset", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the target saw no end of the upload")
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the client saw %v; want a reset", err)
			}
		})
	}
}

// cutProxy forwards TCP connections to a target. On the first one whose
// bytes toward the dialer (down) or toward the target (up) pass cutAfter,
// it sends a FIN that way and forwards that way no more: the end of a TCP
// connection without the TLS close_notify that would end a flow.
type cutProxy struct {
	ln       net.Listener
	target   string
	down     bool
	cutAfter int64
	once     sync.Once
}

func newCutProxy(t *testing.T, target string, down bool, cutAfter int64) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, down: down, cutAfter: cutAfter}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, tc)
			mu.Unlock()
			up, down := p.copy(tc.(*net.TCPConn), c, !p.down), p.copy(c.(*net.TCPConn), tc, p.down)
			wg.Go(up)
			wg.Go(down)
		}
	})
	return p
}

// copy forwards src to dst; when cuts, it is the way a cut may happen. It
// cuts between two TLS records, as the kernel of a relay that died sends
// what the relay wrote (whole records) and then its FIN: a cut inside a
// record crypto/tls already reports as an error.
func (p *cutProxy) copy(dst *net.TCPConn, src net.Conn, cuts bool) func() {
	return func() {
		buf := make([]byte, 32<<10)
		var n int64
		var rec tlsRecords
		for {
			m, err := src.Read(buf)
			if m > 0 {
				if cuts {
					if at, ok := rec.boundary(buf[:m], p.cutAfter-n); ok {
						mine := false
						p.once.Do(func() { mine = true })
						if mine {
							dst.Write(buf[:at])
							dst.CloseWrite()
							io.Copy(io.Discard, src)
							return
						}
					}
				}
				if _, werr := dst.Write(buf[:m]); werr != nil {
					return
				}
				n += int64(m)
			}
			if err != nil {
				dst.CloseWrite()
				return
			}
		}
	}
}

// tlsRecords follows the record boundaries of a TLS byte stream.
type tlsRecords struct {
	hdr  [5]byte
	have int // bytes of the current header read
	left int // bytes of the current record's body still to come
}

// boundary walks b and returns the first record boundary at or past from
// (an offset into b), if b holds one.
func (r *tlsRecords) boundary(b []byte, from int64) (int, bool) {
	for i := 0; i <= len(b); {
		if r.have == 0 && r.left == 0 && int64(i) >= from {
			return i, true
		}
		if i == len(b) {
			break
		}
		if r.left > 0 {
			k := min(r.left, len(b)-i)
			r.left -= k
			i += k
			continue
		}
		r.hdr[r.have] = b[i]
		r.have++
		i++
		if r.have == len(r.hdr) {
			r.left = int(r.hdr[3])<<8 | int(r.hdr[4])
			r.have = 0
		}
	}
	return 0, false
}
