package flow

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
)

// What a TCP connection retransmitted counts toward its link's loss only
// where the path lost a segment: a retransmission the receiver reports as
// a duplicate (D-SACK), sent because its acknowledgment came late, is none.
// The connection crosses an emulated link between two namespaces, whose
// acknowledgments are first delayed, then whose data is dropped.
func TestSegmentsCountRetransmissionsOfLossesAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		gate.Missing(t, "network namespaces need root")
	}
	n, err := linkemu.NewNet(fmt.Sprintf("seg%d", os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	a, err := n.AddNode("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddNode("b")
	if err != nil {
		t.Fatal(err)
	}
	link, err := n.Connect(a, b, linkemu.Params{})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := b.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(b.Addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	if err := a.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := srv.Read(buf); err != nil {
				return
			}
		}
	}()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	counted := func() (retransmitted uint32) {
		raw.Control(func(fd uintptr) {
			_, retransmitted = segmentsOf(int(fd))
			info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		})
		return retransmitted
	}
	// settled waits until all sent is acknowledged and at least least
	// segments were retransmitted.
	settled := func(least uint32) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			counted()
			if info.Unacked == 0 && info.Total_retrans >= least {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("nothing retransmitted, or not acknowledged: %d unacknowledged, %d retransmitted", info.Unacked, info.Total_retrans)
			}
		}
	}
	send := func() {
		t.Helper()
		if _, err := c.Write(make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	send()
	settled(0)

	// Acknowledgments 600 ms late: the sender's timers fire, and what it
	// sends again reaches the receiver twice.
	link.SetDirections(linkemu.Params{}, linkemu.Params{Delay: 600 * time.Millisecond})
	send()
	time.Sleep(time.Second)
	link.SetDirections(linkemu.Params{}, linkemu.Params{})
	settled(info.Total_retrans + 1)
	// The last report of a duplicate may still be on its late way.
	time.Sleep(time.Second)
	if got := counted(); got != 0 {
		t.Fatalf("late acknowledgments: %d retransmissions counted as losses (%d sent again, %d reported duplicate), want 0", got, info.Total_retrans, info.Dsack_dups)
	}

	// Data dropped: what is sent again is a loss repaired.
	spurious := info.Total_retrans
	link.SetDirections(linkemu.Params{Loss: 1}, linkemu.Params{})
	send()
	time.Sleep(300 * time.Millisecond)
	link.SetDirections(linkemu.Params{}, linkemu.Params{})
	settled(spurious + 1)
	if got := counted(); got == 0 {
		t.Fatalf("a lost segment: no retransmission counted (%d sent again, %d reported duplicate)", info.Total_retrans, info.Dsack_dups)
	}
}
