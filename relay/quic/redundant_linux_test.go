package quic

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/pki"
)

// On the wire: a lone packet to a lossy peer goes twice, a GSO batch once,
// and nothing goes twice to a peer that loses nothing.
func TestLonePacketsGoTwiceToALossyPeer(t *testing.T) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	red := newRedundancy(nil, nil)
	tx := newLossyConn(udp, red, func(string) {})
	to := rx.LocalAddr().(*net.UDPAddr)

	// count reads what arrives until the socket stays quiet.
	count := func() (n int) {
		buf := make([]byte, 2048)
		for {
			rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, _, err := rx.ReadFromUDP(buf); err != nil {
				return n
			}
			n++
		}
	}
	const seg = 1200
	batch := bytes.Repeat([]byte{7}, 3*seg)
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafePointerOf(oob))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	oob[unix.CmsgLen(0)], oob[unix.CmsgLen(0)+1] = byte(seg&0xff), byte(seg>>8) // native endian on amd64/arm64
	if got := gsoSegment(oob); got != seg {
		t.Fatalf("gsoSegment read %d; want %d", got, seg)
	}

	send := func() (lone, batched int) {
		if _, _, err := tx.WriteMsgUDP([]byte("echo"), nil, to); err != nil {
			t.Fatal(err)
		}
		lone = count()
		if _, _, err := tx.WriteMsgUDP(batch, oob, to); err != nil {
			t.Fatalf("GSO send: %v", err)
		}
		return lone, count()
	}
	if lone, batched := send(); lone != 1 || batched != 3 {
		t.Fatalf("to a peer without loss: %d lone, %d batched packets arrived; want 1 and 3", lone, batched)
	}
	red.judge(map[netip.AddrPort]counts{to.AddrPort(): {sent: 1000, lost: 10}}, time.Now())
	if lone, batched := send(); lone != 2 || batched != 3 {
		t.Fatalf("to a peer that lost 1%%: %d lone, %d batched packets arrived; want 2 and 3", lone, batched)
	}
}

// Both ends of a lossy link turn copies on: the end that asks and the one
// that answers, each from the losses its own packets met. The link carries
// only sequential echoes, whose lost packets quic-go's probe timeouts
// recover without counting a loss: the peers' reports of what arrived
// (counts.go) are what show the link's 1%.
func TestBothEndsOfALossyLinkCopy(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	b := testEndpointWith(t, ca, "b", func(_ *Conn, s *quicgo.Stream) {
		io.Copy(s, s)
		s.Close()
	})
	a := testEndpoint(t, ca, "a", nil)
	lossy, err := linkemu.NewUDPProxy("127.0.0.1:0", b.Addr().String(), linkemu.Params{Loss: 0.01, Delay: 100 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lossy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, s, err := a.Links().Link("b", Control, []string{lossy.Addr()}).OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 1000)
	copies := func(e *Endpoint) float64 {
		return testutil.ToFloat64(e.opts.Metrics.RedundantCopies.WithLabelValues(e.opts.Name))
	}
	for i := 0; i < 5000 && (copies(a) < 20 || copies(b) < 20); i++ {
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, msg); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	if copies(a) < 20 || copies(b) < 20 {
		t.Fatalf("after 5,000 echoes over a link losing 1%%: %v copies from the asking end, %v from the answering end", copies(a), copies(b))
	}
}
