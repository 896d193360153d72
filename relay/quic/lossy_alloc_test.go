package quic

import (
	"net"
	"testing"
	"time"
)

// A packet sent to a peer given in net's 16-byte form of an IPv4 address
// (as net.IPv4 makes it) reaches it from an IPv4 socket, and sending it
// allocates nothing: quic-go sends every packet through WriteMsgUDP.
func TestLossyConnSendsWithoutAllocating(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	c := newLossyConn(tx, nil, func(string) {})
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: rx.LocalAddr().(*net.UDPAddr).Port}
	if len(to.IP) != net.IPv6len {
		t.Fatal("net.IPv4 no longer makes the 16-byte form this test is about")
	}
	if _, _, err := c.WriteMsgUDP([]byte("hello"), nil, to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := rx.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	msg := make([]byte, 100)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := c.WriteMsgUDP(msg, nil, to); err != nil {
			t.Fatal(err)
		}
		rx.Read(buf)
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per packet sent", allocs)
	}
}
