package quic

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// A run of packets the sender passed in one GSO send arrives as one GRO
// read, and ReadBatch hands quic-go each packet in its own buffer, with
// the sender and the control messages quic-go asked for (the TOS byte),
// across calls when quic-go's batch is smaller than the run.
func TestGROSplitsARunIntoPackets(t *testing.T) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	raw, _ := rx.SyscallConn()
	raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) })
	pc, ok := withGRO(newLossyConn(rx, nil, func(string) {})).(*groConn)
	if !ok {
		t.Fatal("the kernel refused UDP_GRO")
	}
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	// 11 segments of 1200 bytes and a short last one, in one sendmsg.
	const seg = 1200
	var run []byte
	for i := range 11 {
		run = append(run, bytes.Repeat([]byte{byte(i)}, seg)...)
	}
	run = append(run, bytes.Repeat([]byte{11}, 300)...)
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafePointerOf(oob))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	oob[unix.CmsgLen(0)], oob[unix.CmsgLen(0)+1] = byte(seg&0xff), byte(seg>>8) // native endian on amd64/arm64
	if _, _, err := tx.WriteMsgUDP(run, oob, nil); err != nil {
		t.Fatalf("GSO send: %v", err)
	}
	// And one plain datagram after it.
	tx.Write([]byte("plain"))

	ms := make([]ipv4.Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1452)}
		ms[i].OOB = make([]byte, 128)
	}
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got [][]byte
	var reads int
	for len(got) < 13 && reads < 20 {
		n, err := pc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("after %d packets: %v", len(got), err)
		}
		reads++
		for _, m := range ms[:n] {
			got = append(got, append([]byte(nil), m.Buffers[0][:m.N]...))
			if m.Addr.String() != tx.LocalAddr().String() {
				t.Fatalf("from %v, want %v", m.Addr, tx.LocalAddr())
			}
			cms, err := unix.ParseSocketControlMessage(m.OOB[:m.NN])
			if err != nil || len(cms) != 1 || cms[0].Header.Level != unix.IPPROTO_IP || cms[0].Header.Type != unix.IP_TOS {
				t.Fatalf("control messages %+v (%v), want the TOS byte alone", cms, err)
			}
		}
	}
	if len(got) != 13 {
		t.Fatalf("%d packets in %d reads, want 13", len(got), reads)
	}
	for i := range 11 {
		if len(got[i]) != seg || got[i][0] != byte(i) || got[i][seg-1] != byte(i) {
			t.Fatalf("packet %d: %d bytes starting %d", i, len(got[i]), got[i][0])
		}
	}
	if len(got[11]) != 300 || string(got[12]) != "plain" {
		t.Fatalf("tail %d bytes, then %q", len(got[11]), got[12])
	}
	// Coalesced: 8 slots, so the run took two calls, not twelve reads.
	if reads > 3 {
		t.Errorf("%d reads for 13 packets: the run was not coalesced", reads)
	}
}

// Reading a peer's packets one by one allocates nothing: the sender's
// address is made once for a run of reads from it, and the control
// messages are walked in place.
func TestGROReadsWithoutAllocating(t *testing.T) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	raw, _ := rx.SyscallConn()
	raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) })
	pc, ok := withGRO(newLossyConn(rx, nil, func(string) {})).(*groConn)
	if !ok {
		t.Fatal("the kernel refused UDP_GRO")
	}
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	ms := make([]ipv4.Message, 1)
	ms[0].Buffers = [][]byte{make([]byte, 1452)}
	ms[0].OOB = make([]byte, 128)
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("a packet")
	allocs := testing.AllocsPerRun(100, func() {
		tx.Write(msg)
		n, err := pc.ReadBatch(ms, 0)
		if err != nil || n != 1 || string(ms[0].Buffers[0][:ms[0].N]) != "a packet" || ms[0].NN == 0 {
			t.Fatalf("%d packets, %v", n, err)
		}
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per packet read", allocs)
	}
}
