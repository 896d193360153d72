//go:build linux

package sockio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) { return testutil.TCPPair(t) }

// TestConnIsNetsSocket: a Conn's reads and writes carry every byte, wait
// on the poller both ways (a write larger than the socket holds), and end
// as net's would: io.EOF at a clean end, the socket's error at a reset, a
// timeout past the deadline, net.ErrClosed once closed.
func TestConnIsNetsSocket(t *testing.T) {
	a, b := pair(t)
	ca, _ := New(a)
	cb, _ := New(b)
	if ca == nil || cb == nil {
		t.Fatal("no raw socket")
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: fills the socket
	done := make(chan error, 1)
	go func() {
		_, err := ca.Write(want)
		if err == nil {
			err = a.CloseWrite()
		}
		done <- err
	}()
	var got bytes.Buffer
	buf := make([]byte, 7000)
	for {
		n, err := cb.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("read %d bytes, not the %d written", got.Len(), len(want))
	}
	if n, err := cb.ReadNow(buf); n != 0 || err != io.EOF {
		t.Fatalf("ReadNow at the end: %d, %v", n, err)
	}

	c, d := pair(t)
	cc, _ := New(c)
	if n, err := cc.ReadNow(buf); n != 0 || err != nil {
		t.Fatalf("ReadNow of nothing: %d, %v", n, err)
	}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := cc.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	d.SetLinger(0)
	d.Close()
	if _, err := cc.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read of a reset socket: %v", err)
	}
	c.Close()
	if _, err := cc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

// TestUDPIsNetsSocket: a datagram sent with WriteMsg arrives whole, and
// ReadMsg gives its sender as net's read does, from IPv4 and dual-stack
// sockets alike (an IPv4 peer of the latter mapped).
func TestUDPIsNetsSocket(t *testing.T) {
	for _, tc := range []struct{ net, addr string }{{"udp4", "127.0.0.1:0"}, {"udp", "[::]:0"}, {"udp6", "[::1]:0"}} {
		t.Run(tc.net+" "+tc.addr, func(t *testing.T) {
			rx, err := net.ListenUDP(tc.net, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.addr)))
			if err != nil {
				// The suite needs IPv6 loopback elsewhere too (PROXY
				// protocol, eyeballs): a host without it fails here first.
				t.Fatalf("no %s socket here: %v", tc.addr, err)
			}
			defer rx.Close()
			tx, err := net.ListenUDP(tc.net, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.addr)))
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Close()
			host := "127.0.0.1"
			if tc.addr == "[::1]:0" {
				host = "::1"
			}
			port := func(c *net.UDPConn) uint16 { return c.LocalAddr().(*net.UDPAddr).AddrPort().Port() }
			to := netip.AddrPortFrom(netip.MustParseAddr(host), port(rx))
			utx, ok := NewUDP(tx)
			if !ok || !utx.Sends(to) {
				t.Fatal("cannot send raw")
			}
			urx, _ := NewUDP(rx)
			msg := []byte("a datagram")
			// net's own read gives the sender's form to compare.
			if _, _, err := utx.WriteMsg(msg, nil, to); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			rx.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _, _, netFrom, err := rx.ReadMsgUDPAddrPort(buf, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n, oobn, err := utx.WriteMsg(msg, nil, to); n != len(msg) || oobn != 0 || err != nil {
				t.Fatalf("WriteMsg: %d, %d, %v", n, oobn, err)
			}
			oob := make([]byte, 64)
			n, _, _, from, err := urx.ReadMsg(buf, oob)
			if err != nil || !bytes.Equal(buf[:n], msg) {
				t.Fatalf("ReadMsg: %q, %v", buf[:n], err)
			}
			if from != netFrom {
				t.Fatalf("sender %v, net says %v", from, netFrom)
			}
			rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, _, _, _, err := urx.ReadMsg(buf, oob); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("ReadMsg past the deadline: %v", err)
			}
		})
	}
}
