package relay

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// sidecarEntry starts sidecar relay a, the entry of a chain to relay b,
// with a TCP and a UDP Tunnel that name no spec.listen.address, each to
// an echo server on b's loopback; it returns a and the Tunnels' ports.
func sidecarEntry(t *testing.T) (a *Relay, tcpPort, udpPort int) {
	t.Helper()
	return sidecarEntryWith(t, "")
}

// sidecarEntryWith is sidecarEntry with more fields of the Tunnels'
// spec.listen (listen: ", allowedSources: [...]").
func sidecarEntryWith(t *testing.T, listen string) (a *Relay, tcpPort, udpPort int) {
	t.Helper()
	a, tcpPort, udpPort, _ = entryRelays(t, listen, true)
	return a, tcpPort, udpPort
}

// entryRelays starts relay a, sidecar or not, as sidecarEntryWith does; it
// also returns the manifests of the same relays and Tunnels with a sidecar
// or not, for a's Update.
func entryRelays(t *testing.T, listen string, sidecar bool) (a *Relay, tcpPort, udpPort int, manifests func(sidecar bool) *manifest.Set) {
	t.Helper()
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	tcpPort, udpPort = testutil.FreePort(t), testutil.FreePort(t)
	echo := testutil.EchoServer(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	manifests = func(sidecar bool) *manifest.Set {
		mode := ""
		if sidecar {
			mode = ", sidecar: {}"
		}
		set, err := manifest.Parse("test.yaml", fmt.Appendf(nil, `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: a}
spec: {listen: {port: %d}%s}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: b}
spec: {listen: {port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: a, exit: b, route: [a, b]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: tcp}
spec: {chain: c, listen: {port: %d%s}, target: %q}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: udp}
spec: {chain: c, protocol: udp, listen: {port: %d%s}, target: %q}
`, pa, mode, pb, pb, tcpPort, listen, echo, udpPort, listen, pc.LocalAddr().String()))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	set := manifests(sidecar)
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	relays := map[string]*Relay{}
	for _, name := range []string{"b", "a"} {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{Name: name, Manifests: set, Identity: id, Metrics: m, Log: testutil.Logger()})
		if err == nil {
			err = r.Start()
		}
		if err != nil {
			t.Fatalf("relay %s: %v", name, err)
		}
		t.Cleanup(func() { r.Close() })
		relays[name] = r
	}
	return relays["a"], tcpPort, udpPort, manifests
}

// roundTrip sends a line through the Tunnel at addr and expects it back.
func roundTrip(network, addr string) error {
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err = roundTripOnce(network, addr); err == nil {
			return nil
		}
	}
	return err
}

func roundTripOnce(network, addr string) error {
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "hello %s\n", addr); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("hello %s\n", addr); got != want {
		return fmt.Errorf("got %q back, want %q", got, want)
	}
	return nil
}

// entryListenOf is where a's status says the Tunnel named listens.
func entryListenOf(a *Relay, tunnel string) (string, bool) {
	for _, e := range a.status().Entries {
		if e.Tunnel == "default/"+tunnel {
			return e.Listen, e.Open
		}
	}
	return "", false
}

// A Tunnel entering at a sidecar relay with no spec.listen.address
// listens on both loopbacks of its pod: an app that dials localhost may
// be given ::1 first. TCP and UDP answer on 127.0.0.1 and on ::1, and
// status says localhost:PORT.
func TestSidecarEntryListensOnBothLoopbacks(t *testing.T) {
	if c, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	a, tcpPort, udpPort := sidecarEntry(t)
	for _, host := range []string{"127.0.0.1", "::1"} {
		if err := roundTrip("tcp", net.JoinHostPort(host, strconv.Itoa(tcpPort))); err != nil {
			t.Errorf("TCP Tunnel at %s: %v", host, err)
		}
		if err := roundTrip("udp", net.JoinHostPort(host, strconv.Itoa(udpPort))); err != nil {
			t.Errorf("UDP Tunnel at %s: %v", host, err)
		}
	}
	for name, port := range map[string]int{"tcp": tcpPort, "udp": udpPort} {
		if got, open := entryListenOf(a, name); !open || got != "localhost:"+strconv.Itoa(port) {
			t.Errorf("status of Tunnel %s: listen %q, open %v; want localhost:%d, open", name, got, open, port)
		}
	}
}

// A pod with IPv6 disabled has no ::1: its sidecar's Tunnels listen on
// 127.0.0.1 alone, and say so. An address of the documentation prefix,
// which this host does not have either, stands in for the missing ::1:
// binding it fails the same way (EADDRNOTAVAIL, or EAFNOSUPPORT with no
// IPv6 at all).
func TestSidecarEntryWithoutIPv6Loopback(t *testing.T) {
	saved := sidecarLoopbacks
	sidecarLoopbacks = []string{"127.0.0.1", "2001:db8::1"}
	t.Cleanup(func() { sidecarLoopbacks = saved })
	a, tcpPort, udpPort := sidecarEntry(t)
	for name, port := range map[string]int{"tcp": tcpPort, "udp": udpPort} {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := roundTrip(name, addr); err != nil {
			t.Errorf("%s Tunnel at 127.0.0.1: %v", name, err)
		}
		if got, open := entryListenOf(a, name); !open || got != addr {
			t.Errorf("status of Tunnel %s: listen %q, open %v; want %s, open", name, got, open, addr)
		}
	}
}

// Only a missing address is passed over: a loopback port another process
// holds fails the entry, and what opened before is closed again.
func TestListenEachFailsOnATakenLoopback(t *testing.T) {
	port := strconv.Itoa(testutil.FreePort(t))
	taken, err := net.Listen("tcp", net.JoinHostPort("::1", port))
	if err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	}
	defer taken.Close()
	listen := func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	addrs := []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}
	if _, _, err := listenEach(addrs, true, listen); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a taken ::1 port: %v, want EADDRINUSE", err)
	}
	ln, err := net.Listen("tcp", addrs[0])
	if err != nil {
		t.Fatalf("127.0.0.1 was left open: %v", err)
	}
	ln.Close()
	if _, _, err := listenEach([]string{"[2001:db8::1]:" + port}, true, listen); err == nil {
		t.Error("no loopback at all opened, and no error")
	}
}

// A Tunnel whose spec.listen.allowedSources admit one loopback's family
// alone does not listen on the other loopback. Listening there would
// accept an app's connection to ::1 and reset it at once (the source is
// not allowed), where no listener refuses it and the app, dialing
// localhost, falls back to 127.0.0.1 as it did before sidecars listened
// on ::1; the same the other way round.
func TestSidecarEntryListensOnTheLoopbacksItsSourcesAdmit(t *testing.T) {
	if c, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	for _, c := range []struct{ sources, open, shut string }{
		{`["127.0.0.0/8"]`, "127.0.0.1", "::1"},
		{`["::1/128", "10.0.0.0/8"]`, "::1", "127.0.0.1"},
	} {
		a, tcpPort, udpPort := sidecarEntryWith(t, ", allowedSources: "+c.sources)
		if err := roundTrip("tcp", net.JoinHostPort(c.open, strconv.Itoa(tcpPort))); err != nil {
			t.Errorf("sources %s: TCP Tunnel at %s: %v", c.sources, c.open, err)
		}
		if err := roundTrip("udp", net.JoinHostPort(c.open, strconv.Itoa(udpPort))); err != nil {
			t.Errorf("sources %s: UDP Tunnel at %s: %v", c.sources, c.open, err)
		}
		shut := net.JoinHostPort(c.shut, strconv.Itoa(tcpPort))
		if conn, err := net.DialTimeout("tcp", shut, time.Second); err == nil {
			conn.Close()
			t.Errorf("sources %s: %s takes connections its sources refuse: a client dialing localhost gets a reset, not a refusal to fall back on", c.sources, shut)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("sources %s: dialing %s: %v, want connection refused", c.sources, shut, err)
		}
		for name, port := range map[string]int{"tcp": tcpPort, "udp": udpPort} {
			want := net.JoinHostPort(c.open, strconv.Itoa(port))
			if got, open := entryListenOf(a, name); !open || got != want {
				t.Errorf("sources %s: status of Tunnel %s: listen %q, open %v; want %s, open", c.sources, name, got, open, want)
			}
		}
	}
}

// A relay whose RelayNode turns sidecar (or stops being one) while it runs
// moves the entries that name no spec.listen.address to where they now
// listen, though their Tunnels' specs did not change: a relay of files
// made a sidecar must not go on serving its Tunnels on every address.
func TestEntryMovesWhenItsRelayTurnsSidecar(t *testing.T) {
	if c, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		gate.Missing(t, "no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	a, tcpPort, udpPort, manifests := entryRelays(t, "", false)
	for name, port := range map[string]int{"tcp": tcpPort, "udp": udpPort} {
		if got, open := entryListenOf(a, name); !open || got != ":"+strconv.Itoa(port) {
			t.Fatalf("before: status of Tunnel %s: listen %q, open %v; want :%d, open", name, got, open, port)
		}
	}
	for _, sidecar := range []bool{true, false} {
		if err := a.Update(manifests(sidecar)); err != nil {
			t.Fatal(err)
		}
		for name, port := range map[string]int{"tcp": tcpPort, "udp": udpPort} {
			want := ":" + strconv.Itoa(port)
			if sidecar {
				want = "localhost" + want
			}
			if got, open := entryListenOf(a, name); !open || got != want {
				t.Errorf("sidecar %v: status of Tunnel %s: listen %q, open %v; want %s, open", sidecar, name, got, open, want)
			}
			if err := roundTrip(name, net.JoinHostPort("::1", strconv.Itoa(port))); err != nil {
				t.Errorf("sidecar %v: %s Tunnel at ::1: %v", sidecar, name, err)
			}
		}
	}
}
