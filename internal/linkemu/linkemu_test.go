package linkemu

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
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

// echoThrough starts a UDP echo behind a proxy with p and dials the proxy.
func echoThrough(t *testing.T, p Params) (*UDPProxy, *net.UDPConn) {
	t.Helper()
	proxy, err := NewUDPProxy("127.0.0.1:0", udpEcho(t), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c, err := net.Dial("udp", proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return proxy, c.(*net.UDPConn)
}

func TestUDPDelayLossAndLiveChange(t *testing.T) {
	p, uc := echoThrough(t, Params{Delay: 20 * time.Millisecond})
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

// A LAN's delay is a fraction of a millisecond; Go's timers alone fire about
// a millisecond late when the process idles, which made a 100 µs link take
// 1.1 ms each way and a 1,000-echo LAN benchmark measure a WAN.
func TestSubMillisecondDelay(t *testing.T) {
	_, c := echoThrough(t, Params{Delay: 100 * time.Microsecond})
	var rtts []time.Duration
	for range 50 {
		if rtt, ok := udpRTT(t, c); ok {
			rtts = append(rtts, rtt)
		}
	}
	if len(rtts) < 40 {
		t.Fatalf("%d of 50 pings answered on a lossless link", len(rtts))
	}
	slices.Sort(rtts)
	// Two 100 µs delays and two loopback hops: well under a millisecond,
	// and never under the delays themselves.
	if med := rtts[len(rtts)/2]; med < 200*time.Microsecond || med > 900*time.Microsecond {
		t.Fatalf("median RTT through a 100 µs link: %v; want 200-900 µs", med)
	}
}

func TestUDPJitterKeepsOrder(t *testing.T) {
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	p, err := NewUDPProxy("127.0.0.1:0", sink.LocalAddr().String(), Params{Delay: 5 * time.Millisecond, Jitter: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, _ := net.Dial("udp", p.Addr())
	defer c.Close()
	var sent []time.Time
	for i := range 50 {
		sent = append(sent, time.Now())
		c.Write([]byte{byte(i)})
		time.Sleep(2 * time.Millisecond)
	}
	var minD, maxD time.Duration
	buf := make([]byte, 16)
	for i := range 50 {
		sink.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := sink.Read(buf); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if int(buf[0]) != i {
			t.Fatalf("packet %d arrived as number %d: jitter reordered", buf[0], i)
		}
		d := time.Since(sent[i])
		if i == 0 || d < minD {
			minD = d
		}
		maxD = max(maxD, d)
	}
	if minD < 5*time.Millisecond || maxD-minD < 5*time.Millisecond {
		t.Fatalf("delays %v to %v: want at least 5 ms and a spread from 20 ms of jitter", minD, maxD)
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

func TestNetnsLinks(t *testing.T) {
	// What NewNet needs, which CI has: past these, its error is a failure.
	if os.Geteuid() != 0 {
		gate.Missing(t, "network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		gate.Missing(t, "the ip command is missing (Debian package iproute2)")
	}
	n, err := NewNet(fmt.Sprintf("le%d", os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a, err := n.AddNode("a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.AddNode("b")
	c, _ := n.AddNode("c")
	ab, err := n.Connect(a, b, Params{Delay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Connect(b, c, Params{Delay: time.Millisecond}); err != nil {
		t.Fatal(err)
	}

	// A TCP echo server in b; a client in a reaches it over the link.
	var ln net.Listener
	if err := b.Do(func() (err error) { ln, err = net.Listen("tcp", ":0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	addr := net.JoinHostPort(b.Addr.String(), fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	var conn net.Conn
	if err := a.Do(func() (err error) { conn, err = net.DialTimeout("tcp", addr, 2*time.Second); return }); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rtt := func() time.Duration {
		start := time.Now()
		conn.Write([]byte("x"))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		one := make([]byte, 1)
		if _, err := io.ReadFull(conn, one); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := rtt(); d < 40*time.Millisecond || d > 80*time.Millisecond {
		t.Fatalf("RTT over a 20 ms link: %v", d)
	}
	ab.Set(Params{Delay: 50 * time.Millisecond})
	if d := rtt(); d < 100*time.Millisecond {
		t.Fatalf("RTT after Set(50 ms): %v", d)
	}
	// Loss makes the kernel's TCP retransmit; the bytes still arrive whole.
	ab.Set(Params{Delay: 2 * time.Millisecond, Loss: 0.05})
	data := make([]byte, 256<<10)
	rand.Read(data)
	go conn.Write(data)
	back := make([]byte, len(data))
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(conn, back); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("256 KiB echo over a lossy link: %v (equal %v)", err, bytes.Equal(back, data))
	}
	// Only linked nodes reach each other: a and c have no link.
	err = a.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(c.Addr.String(), "80"), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("a reached c without a link between them")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), a.NS) {
		t.Fatalf("namespace %s left behind", a.NS)
	}
}

// A client that sends before its target listens gets through once it does:
// the proxy's session survives the ICMP error of the first attempt.
func TestUDPSessionSurvivesEarlyRefusal(t *testing.T) {
	probe, _ := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	target := probe.LocalAddr().String()
	probe.Close() // nothing listens there yet
	p, err := NewUDPProxy("127.0.0.1:0", target, Params{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, _ := net.Dial("udp", p.Addr())
	defer c.Close()
	c.Write([]byte("early"))
	time.Sleep(50 * time.Millisecond) // the refusal comes back
	ln, err := net.ListenPacket("udp", target)
	if err != nil {
		// skip-ok: another process took the port in the 50 ms it was free.
		t.Skip("port taken meanwhile")
	}
	defer ln.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := ln.ReadFrom(buf)
			if err != nil {
				return
			}
			ln.WriteTo(buf[:n], from)
		}
	}()
	if _, ok := udpRTT(t, c.(*net.UDPConn)); !ok {
		t.Fatal("no echo once the target listens")
	}
}

// A rate-limited link with a bounded queue drops what would wait past it,
// as a router's full buffer does, and lets the queue drain again.
func TestQueueBound(t *testing.T) {
	// 1,000 bytes take 2 ms at 4 Mbit/s: a 10 ms queue holds the packet
	// being sent and five behind it.
	s := newShaper(Params{Delay: 50 * time.Millisecond, Rate: 4_000_000, Queue: 10 * time.Millisecond})
	now := time.Now()
	passed := 0
	for range 20 {
		if _, _, ok := s.departure(now, 1000); ok {
			passed++
		}
	}
	if st := s.stats(); passed != 6 || st.Sent != 6 || st.Overflow != 14 || st.Lost != 0 {
		t.Fatalf("burst of 20: %d passed, stats %+v; want 6 sent and 14 over the queue", passed, st)
	}
	// Once the queue has drained, a packet waits for nothing but the delay.
	at, _, ok := s.departure(now.Add(time.Second), 1000)
	if !ok || at.Sub(now.Add(time.Second)) != 50*time.Millisecond {
		t.Fatalf("after draining: leaves %v after arriving (ok %v); want the delay alone", at.Sub(now.Add(time.Second)), ok)
	}
}
