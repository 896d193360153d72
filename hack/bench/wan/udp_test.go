//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/linkemu"
	"github.com/hoplink/hoplink/manifest"
)

func TestUDPFlags(t *testing.T) {
	rates, err := parseRates(" 1, 4,16 ,40,80,")
	if err != nil || !slices.Equal(rates, []float64{1, 4, 16, 40, 80}) {
		t.Errorf("parseRates: %v, %v", rates, err)
	}
	if rates, err := parseRates(""); err != nil || rates != nil {
		t.Errorf("parseRates(\"\"): %v, %v: want no rates, the default", rates, err)
	}
	for _, bad := range []string{"0", "-1", "fast", "1,NaN", "Inf"} {
		if _, err := parseRates(bad); err == nil {
			t.Errorf("-udp %q: no error", bad)
		}
	}
	ok := udpOptions{rates: []float64{1}, d: 10 * time.Second, size: 1200}
	for _, mode := range []string{"", "auto", "datagram", "stream"} {
		u := ok
		u.mode = mode
		if err := checkUDP(u); err != nil {
			t.Errorf("-udp-mode %q: %v", mode, err)
		}
	}
	for name, u := range map[string]udpOptions{
		"mode":      {rates: ok.rates, d: ok.d, size: ok.size, mode: "fast"},
		"small":     {rates: ok.rates, d: ok.d, size: udpHeader - 1},
		"big":       {rates: ok.rates, d: ok.d, size: 65508},
		"time":      {rates: ok.rates, size: ok.size},
		"only, no ": {d: ok.d, size: ok.size, only: true},
	} {
		if err := checkUDP(u); err == nil {
			t.Errorf("%s: %+v: no error", name, u)
		}
	}
	ps, _ := parsePaths([]string{"direct", "tunchain", "1hop", "chain"}, []string{"quic"}, 3)
	if got := udpPaths(ps); !slices.Equal(got, []int{0, 2, 3}) {
		t.Errorf("udpPaths: %v, want the paths that are not tun", got)
	}
}

func TestSchedule(t *testing.T) {
	// 16 Mbit/s of 1,200-byte datagrams: 1,666.7 a second.
	n, every := schedule(16, 1200, 10*time.Second)
	if n != 16667 || every != 600*time.Microsecond {
		t.Errorf("schedule: %d every %v", n, every)
	}
	if n, _ := schedule(0.001, 1200, time.Second); n != 1 {
		t.Errorf("a slow rate sends %d, want at least 1", n)
	}
	ms := time.Millisecond
	for _, c := range []struct {
		now  time.Duration
		want int
	}{{0, 0}, {9 * ms, 0}, {10 * ms, 1}, {10*ms + 599*time.Microsecond, 1}, {10*ms + 600*time.Microsecond, 2}, {time.Hour, 100}} {
		if got := due(10*ms, c.now, 600*time.Microsecond, 100); got != c.want {
			t.Errorf("due at %v: %d, want %d", c.now, got, c.want)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var lags []time.Duration
	for i := 100; i >= 1; i-- {
		lags = append(lags, time.Duration(i)*time.Millisecond)
	}
	r := summarize(200, lags, 3)
	if r.got != 100 || r.delivered != 50 || r.dups != 3 {
		t.Errorf("summarize: %+v", r)
	}
	if r.p50 != 50*time.Millisecond || r.p99 != 99*time.Millisecond {
		t.Errorf("p50 %v p99 %v, want 50ms 99ms (nearest rank)", r.p50, r.p99)
	}
	one := []time.Duration{7}
	if percentile(one, 0.5) != 7 || percentile(one, 0.99) != 7 || percentile(nil, 0.5) != 0 {
		t.Error("percentile of one or none")
	}
	if r := summarize(0, nil, 0); r.delivered != 0 || r.p99 != 0 {
		t.Errorf("nothing sent: %+v", r)
	}
}

func TestCollector(t *testing.T) {
	r := &udpReceiver{}
	c := r.start(1, 4)
	c.add(probeBit|3, time.Second, time.Second)
	c.add(0, 150*time.Millisecond, 140*time.Millisecond)
	c.add(2, 160*time.Millisecond, 150*time.Millisecond)
	c.add(2, 170*time.Millisecond, 170*time.Millisecond) // a copy
	c.add(9, time.Millisecond, time.Millisecond)         // not of this schedule
	lags, path, dups := r.close(c)
	c.add(1, 5*time.Second, 5*time.Second) // after the window
	c.add(0, 5*time.Second, 5*time.Second) // a late copy
	if !slices.Equal(lags, []time.Duration{150 * time.Millisecond, 160 * time.Millisecond}) || dups != 1 {
		t.Errorf("lags %v dups %d", lags, dups)
	}
	if !slices.Equal(path, []time.Duration{140 * time.Millisecond, 150 * time.Millisecond}) {
		t.Errorf("path lags %v", path)
	}
	if r.late() != 1 || c.dups != 2 {
		t.Errorf("late %d dups %d, want 1 and 2", r.late(), c.dups)
	}
	select {
	case <-c.probe:
	default:
		t.Error("a probe did not signal")
	}
}

func TestUDPDrops(t *testing.T) {
	before := map[udpDrop]float64{{"seattle", "default/t1-udp", "queue_full"}: 10}
	after := map[udpDrop]float64{
		{"seattle", "default/t1-udp", "queue_full"}:  130,
		{"la", "", "no_session"}:                     2,
		{"hk", "default/t2-udp", "queue_full"}:       50, // another Tunnel
		{"useast", "default/t1-udp", "write_failed"}: 0,
	}
	if got := udpDropsSince(before, after, "default/t1-udp"); got != "la no_session 2, seattle queue_full 120" {
		t.Errorf("udpDropsSince: %q", got)
	}
	if got := udpDropsSince(after, after, "default/t1-udp"); got != "none" {
		t.Errorf("no change: %q", got)
	}
	snmp := "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"Udp: 100 0 5 90 4 1 0 0 0\nUdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n"
	v, ok := snmpUDP("Ip: Forwarding\nIp: 1\n" + snmp)
	if !ok || v != [2]int64{4, 1} {
		t.Errorf("snmpUDP: %v %v", v, ok)
	}
	got := socketDropsSince(map[string][2]int64{"useast": {1, 1}}, map[string][2]int64{"useast": {4, 1}, "hk": {0, 2}}, []string{"hk", "useast"})
	if got != "hk sndbuf 2, useast rcvbuf 3" {
		t.Errorf("socketDropsSince: %q", got)
	}
}

// TestUDPManifests checks that with UDP rates every path that is not tun
// has a UDP Tunnel to the receiver, on a port of its own, with -udp-mode
// as its udp.mode, and that without them the manifests are as before.
func TestUDPManifests(t *testing.T) {
	var nodes []*linkemu.Node
	for i, name := range []string{"hk", "seattle", "la", "useast"} {
		nodes = append(nodes, &linkemu.Node{Name: name, Addr: netip.AddrFrom4([4]byte{10, 213, 0, byte(i + 1)})})
	}
	ps := []path{{}, {1, "quic", false}, {3, "quic", true}, {3, "tls", false}}
	if m := manifests(nodes, ps, udpOptions{}); strings.Contains(m, "protocol: udp") {
		t.Errorf("no -udp, yet a UDP Tunnel:\n%s", m)
	}
	for _, mode := range []string{"", "stream"} {
		set, err := manifest.Parse("m.yaml", []byte(manifests(nodes, ps, udpOptions{rates: []float64{1}, mode: mode})))
		if err != nil {
			t.Fatal(err)
		}
		nw := &network{nodes: nodes}
		ports := map[string]bool{}
		for i, p := range ps {
			tn := set.Tunnel(manifest.Key(manifest.DefaultNamespace, udpTunnel(i)))
			if p.hops == 0 || p.tun {
				if tn != nil {
					t.Errorf("path %d (%s) has a UDP Tunnel", i, p)
				}
				continue
			}
			if tn == nil || tn.Spec.Protocol != v1alpha1.ProtocolUDP || tn.Spec.Target != fmt.Sprintf("127.0.0.1:%d", udpPort) {
				t.Fatalf("path %d (%s): Tunnel %+v, want a UDP Tunnel to the receiver", i, p, tn)
			}
			if got := manifest.Route(set.ChainOf(tn)); len(got) != p.hops+1 {
				t.Errorf("path %d (%s): route %v", i, p, got)
			}
			want := v1alpha1.UDPMode(mode)
			if mode == "" {
				want = v1alpha1.UDPAuto // the default
			}
			if tn.Spec.UDP == nil || tn.Spec.UDP.Mode != want {
				t.Errorf("path %d: udp %+v, want mode %q", i, tn.Spec.UDP, want)
			}
			listen := fmt.Sprintf("%s:%d", tn.Spec.Listen.Address, tn.Spec.Listen.Port)
			if listen != nw.pathAddr(i, p, udpPort) {
				t.Errorf("path %d: Tunnel listens on %s, the sender sends to %s", i, listen, nw.pathAddr(i, p, udpPort))
			}
			for _, port := range []int{echoPort, sinkPort} {
				if listen == nw.pathAddr(i, p, port) {
					t.Errorf("path %d: the UDP Tunnel's port is the TCP Tunnel's for %d", i, port)
				}
			}
			if ports[listen] {
				t.Errorf("path %d: %s taken twice", i, listen)
			}
			ports[listen] = true
		}
		if got := nw.pathAddr(0, ps[0], udpPort); got != "10.213.0.4:7002" {
			t.Errorf("direct sends to %s", got)
		}
	}
}

func TestPathRTT(t *testing.T) {
	g := geography{direct: 300 * time.Millisecond, legs: []time.Duration{152 * time.Millisecond, 32 * time.Millisecond, 69 * time.Millisecond}}
	for p, want := range map[path]time.Duration{{}: 300 * time.Millisecond, {1, "quic", false}: 300 * time.Millisecond, {3, "quic", false}: 253 * time.Millisecond} {
		if got := pathRTT(g, p); got != want {
			t.Errorf("%s: %v, want %v", p, got, want)
		}
	}
}

// TestRenderUDP checks the UDP table between the markers, alone under
// -udp-only and after the TCP table otherwise, and nothing of it without
// UDP rows.
func TestRenderUDP(t *testing.T) {
	o := options{hoplink: "/nonexistent", g: geography{names: []string{"hk", "seattle", "la", "useast"}, direct: 300 * time.Millisecond,
		legs: []time.Duration{152 * time.Millisecond, 32 * time.Millisecond, 69 * time.Millisecond}}, streams: 8,
		udp: udpOptions{rates: []float64{16}, d: 10 * time.Second, size: 1200, only: true}}
	urows := []udpRow{
		{cc: "cubic", loss: 1, p: path{}, rate: 16, udpResult: udpResult{sent: 100, got: 99, delivered: 99, p50: 152 * time.Millisecond, p99: 160 * time.Millisecond, drops: "–"}},
		{cc: "cubic", loss: 1, p: path{3, "quic", false}, rate: 16, udpResult: udpResult{sent: 100, got: 87, delivered: 87, dups: 2, late: 5,
			p50: 2237 * time.Millisecond, p99: 2871 * time.Millisecond, drops: "seattle queue_full 13", kernel: "useast rcvbuf 1",
			behind: 300 * time.Millisecond, pathP50: 2000 * time.Millisecond}},
	}
	out := render(o, nil, urows, time.Minute)
	// Its own markers: a UDP-only run leaves the TCP table in -out alone.
	for _, want := range []string{"<!-- wan-udp:begin -->", "| cubic | 1 | direct | 16 | 99.0 | 152 | 160 | 0 | 0 | – | – |",
		"| cubic | 1 | 3 hops, quic | 16 | 87.0 | 2237 | 2871 | 2 | 5 | 0.0 | seattle queue_full 13; sockets: useast rcvbuf 1; the sender fell up to 300 ms behind schedule (p50 lag behind the send 2000 ms) |", "<!-- wan-udp:end -->"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "1 stream Mbit/s") {
		t.Errorf("-udp-only rendered the TCP table:\n%s", out)
	}
	o.udp.only = false
	rows := []row{{cc: "cubic", loss: 1, p: path{}}}
	if out := render(o, rows, urows, time.Minute); !strings.Contains(out, "1 stream Mbit/s") || !strings.Contains(out, "| 3 hops, quic | 16 |") {
		t.Errorf("render with both:\n%s", out)
	}
	o.udp = udpOptions{}
	if out := render(o, rows, nil, time.Minute); strings.Contains(out, "UDP") {
		t.Errorf("render without UDP rows mentions UDP:\n%s", out)
	}
}

// TestSnapshotUDPDrops reads the relays' UDP drop counters as a relay
// exposes them.
func TestSnapshotUDPDrops(t *testing.T) {
	s := snapshot{flows: map[sample]float64{}, info: map[hop]string{}, goodput: map[sample]float64{}, udpDrops: map[udpDrop]float64{}}
	s.add(`# HELP hoplink_udp_dropped_packets_total UDP packets a relay dropped.
# TYPE hoplink_udp_dropped_packets_total counter
hoplink_udp_dropped_packets_total{reason="queue_full",relay="seattle",tunnel="default/t1-udp"} 42
hoplink_udp_dropped_packets_total{reason="no_session",relay="seattle",tunnel=""} 3
hoplink_udp_sessions{relay="seattle",role="middle",tunnel="default/t1-udp"} 1
hoplink_link_flows_total{from="hk",reason="explicit",to="seattle",transport="quic"} 5
hoplink_udp_datagram_copies_total{relay="seattle"} 7
`)
	s.add(`hoplink_udp_datagram_copies_total{relay="la"} 2
`)
	if s.copies != 9 {
		t.Errorf("copies %v, want 9 (both relays')", s.copies)
	}
	want := map[udpDrop]float64{{"seattle", "default/t1-udp", "queue_full"}: 42, {"seattle", "", "no_session"}: 3}
	if len(s.udpDrops) != len(want) {
		t.Errorf("udpDrops %v, want %v", s.udpDrops, want)
	}
	for k, v := range want {
		if s.udpDrops[k] != v {
			t.Errorf("%v: %v, want %v", k, s.udpDrops[k], v)
		}
	}
	if s.flows[sample{hop{"hk", "seattle"}, "quic", "explicit"}] != 5 {
		t.Errorf("flows %v", s.flows)
	}
}
