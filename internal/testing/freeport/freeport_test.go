package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Picked ports lie below the ephemeral range, are never repeated, and can
// be listened on with TCP and UDP on every address.
func TestPickIsBelowTheEphemeralRangeAndListenable(t *testing.T) {
	start := ephemeralStart()
	seen := map[int]bool{}
	for range 100 {
		p, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if p < lowest || p >= start {
			t.Fatalf("picked %d, want within [%d, %d)", p, lowest, start)
		}
		if seen[p] {
			t.Fatalf("picked %d twice", p)
		}
		seen[p] = true
	}
	for p := range seen {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("TCP on picked port %d: %v", p, err)
		}
		l.Close()
		u, err := net.ListenPacket("udp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("UDP on picked port %d: %v", p, err)
		}
		u.Close()
	}
}

// A port someone listens on, on TCP or on UDP, is not picked.
func TestPickSkipsATakenPort(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	free, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	handedOut.Delete(free)
	seq := []int{tcp.Addr().(*net.TCPAddr).Port, udp.LocalAddr().(*net.UDPAddr).Port, free}
	got, err := pick(func() int { p := seq[0]; seq = seq[1:]; return p })
	if err != nil || got != free {
		t.Fatalf("pick = %d, %v; want %d, the first port not taken", got, err, free)
	}
}
