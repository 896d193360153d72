//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hoplink/hoplink/internal/linkemu"
)

// What the relays report: the flows each opened toward the next relay, by
// transport and reason (hoplink_link_flows_total), and under transport
// auto a link's bulk transport and the goodput it saw per transport.

type hop struct{ from, to string }

// sample is a counter or gauge of one relay's hop.
type sample struct {
	hop
	transport, reason string
}

type snapshot struct {
	flows   map[sample]float64
	info    map[hop]string     // bulk transport (reason)
	goodput map[sample]float64 // reason left empty
	// udpDrops: hoplink_udp_dropped_packets_total by relay, tunnel and
	// reason.
	udpDrops map[udpDrop]float64
	// copies: hoplink_udp_datagram_copies_total, all relays together.
	copies float64
}

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// snapshot reads every relay's metrics; a relay that does not answer
// leaves its figures out.
func (nw *network) snapshot() snapshot {
	s := snapshot{flows: map[sample]float64{}, info: map[hop]string{}, goodput: map[sample]float64{}, udpDrops: map[udpDrop]float64{}}
	if len(nw.procs) == 0 {
		return s
	}
	for _, node := range nw.nodes {
		text, err := nw.metricsOf(node)
		if err != nil {
			continue
		}
		s.add(text)
	}
	return s
}

// add reads one relay's metrics into s.
func (s *snapshot) add(text string) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "hoplink_link_") && name != "hoplink_udp_dropped_packets_total" && name != "hoplink_udp_datagram_copies_total" {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, m := range labelRE.FindAllStringSubmatch(labels, -1) {
			l[m[1]] = m[2]
		}
		h := hop{l["from"], l["to"]}
		switch name {
		case "hoplink_link_flows_total":
			s.flows[sample{h, l["transport"], l["reason"]}] = v
		case "hoplink_link_transport_info":
			if v == 1 {
				s.info[h] = fmt.Sprintf("%s (%s)", l["transport"], l["reason"])
			}
		case "hoplink_link_goodput_bits_per_second":
			s.goodput[sample{h, l["transport"], ""}] = v
		case "hoplink_udp_dropped_packets_total":
			s.udpDrops[udpDrop{l["relay"], l["tunnel"], l["reason"]}] = v
		case "hoplink_udp_datagram_copies_total":
			s.copies += v
		}
	}
}

// flowsSince are the flows auto opened on each hop of hops since before,
// per hop: "tls 8 unmeasured, quic 1 sampling". Flows of chains that name
// their transport (reason explicit) are left out: they may cross the same
// hops at the same time.
func flowsSince(before, after snapshot, hops []hop) []string {
	var out []string
	for _, h := range hops {
		var parts []string
		for k, v := range after.flows {
			if k.hop != h || k.reason == "explicit" {
				continue
			}
			if n := v - before.flows[k]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s %.0f %s", k.transport, n, k.reason))
			}
		}
		slices.Sort(parts)
		if len(parts) == 0 {
			parts = []string{"none"}
		}
		out = append(out, strings.Join(parts, ", "))
	}
	return out
}

// perHop joins what each hop did, once when they all agree.
func perHop(hops []hop, each []string) string {
	if len(each) == 0 {
		return "-"
	}
	same := true
	for _, e := range each {
		same = same && e == each[0]
	}
	if same {
		if len(each) > 1 {
			return each[0] + " (each hop)"
		}
		return each[0]
	}
	var parts []string
	for i, h := range hops {
		parts = append(parts, fmt.Sprintf("%s→%s: %s", h.from, h.to, each[i]))
	}
	return strings.Join(parts, "; ")
}

// transports is the set of transports in flowsSince's strings: "quic",
// "tls", "tls+quic".
func transports(each []string) string {
	var seen []string
	for _, e := range each {
		for _, part := range strings.Split(e, ", ") {
			t, _, _ := strings.Cut(part, " ")
			if t != "none" && !slices.Contains(seen, t) {
				seen = append(seen, t)
			}
		}
	}
	slices.Sort(seen)
	slices.Reverse(seen) // tls first
	if len(seen) == 0 {
		return "none"
	}
	return strings.Join(seen, "+")
}

// busiestCC is the congestion control of the relay-to-relay TCP socket
// that sent the most from node (ss, inside its namespace), or "" when
// none sent 64 KiB: the hop rode QUIC.
func busiestCC(node *linkemu.Node) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := []string{"netns", "exec", node.NS, "ss", "-tinH", "state", "established", "(", "dport", "=", ":7401", ")"}
	out, err := exec.CommandContext(ctx, "ip", args...).Output()
	if err != nil {
		return ""
	}
	best, cc := int64(64<<10), ""
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		name, acked := "", int64(0)
		for i, f := range fields {
			if strings.HasPrefix(f, "wscale:") && i > 0 {
				name = fields[i-1]
			}
			if v, ok := strings.CutPrefix(f, "bytes_acked:"); ok {
				acked, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if name != "" && acked > best {
			best, cc = acked, name
		}
	}
	return cc
}
