package linkemu

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

func udpEcho(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:n], from)
		}
	}()
	return c.LocalAddr().String()
}

// udpRTT sends one datagram and waits for its echo.
func udpRTT(t *testing.T, c *net.UDPConn) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	c.Write([]byte("ping"))
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 16)
	_, err := c.Read(buf)
	return time.Since(start), err == nil
}

func TestUDPDelayLossAndLiveChange(t *testing.T) {
	p, err := NewUDPProxy("127.0.0.1:0", udpEcho(t), Params{Delay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("udp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UDPConn)
	rtt, ok := udpRTT(t, uc)
	if !ok || rtt < 40*time.Millisecond || rtt > 400*time.Millisecond {
		t.Fatalf("RTT through a 20 ms link: %v (answered %v); want at least 40 ms", rtt, ok)
	}
	p.Set(Params{Delay: 2 * time.Millisecond})
	if rtt, ok = udpRTT(t, uc); !ok || rtt >= 40*time.Millisecond {
		t.Fatalf("after Set(2 ms) the RTT is %v (answered %v)", rtt, ok)
	}
	p.Set(Params{Loss: 1})
	if _, ok = udpRTT(t, uc); ok {
		t.Fatal("a packet crossed a link that loses everything")
	}
}

func TestUDPRate(t *testing.T) {
	// A sink counts what arrives; 200 KB at 4 Mbit/s take at least 0.4 s.
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	p, err := NewUDPProxy("127.0.0.1:0", sink.LocalAddr().String(), Params{Rate: 4_000_000})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, _ := net.Dial("udp", p.Addr())
	defer c.Close()
	start := time.Now()
	for range 200 {
		c.Write(make([]byte, 1000))
	}
	got := 0
	buf := make([]byte, 2000)
	for got < 200 {
		sink.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := sink.Read(buf); err != nil {
			break
		}
		got++
	}
	if elapsed := time.Since(start); got != 200 || elapsed < 380*time.Millisecond {
		t.Fatalf("%d of 200 datagrams in %v; want all, paced to at least 0.4 s", got, elapsed)
	}
}

func TestTCPDelayIntegrityAndHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.(*net.TCPConn).CloseWrite() }()
		}
	}()
	p, err := NewTCPProxy("127.0.0.1:0", ln.Addr().String(), Params{Delay: 15 * time.Millisecond, Loss: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.Write([]byte("x"))
	one := make([]byte, 1)
	if _, err := io.ReadFull(c, one); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 30*time.Millisecond {
		t.Fatalf("RTT %v through a 15 ms link", rtt)
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	go func() { c.Write(data); c.(*net.TCPConn).CloseWrite() }()
	back, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("echo of 1 MiB: %d bytes, equal %v, err %v (TCP must not lose bytes)", len(back), bytes.Equal(back, data), err)
	}
}
