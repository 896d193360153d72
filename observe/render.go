package observe

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/measure"
)

// WriteReport renders r as tables: relays, links, chains (with their
// candidates), Tunnels, then what is not ready.
func WriteReport(w io.Writer, r *Report) error {
	if r.RelaysNotAsked != "" {
		return writeAPIReport(w, r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RELAY\tREADY\tVERSION\tPEERS UP\tCERT EXPIRES\tENDPOINT")
	for _, rl := range r.Relays {
		s := rl.Status
		if s == nil {
			fmt.Fprintf(tw, "%s\tunreachable\t-\t-\t-\t%s\n", rl.Name, orDash(rl.Endpoint))
			continue
		}
		ready := yesNo(s.Ready)
		if s.Draining {
			ready = "draining"
		}
		up := 0
		for _, p := range s.Peers {
			if p.Up {
				up++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", rl.Name, ready, orDash(s.Version), up, len(s.Peers), expires(s.CertificateExpires, r.Time), rl.Endpoint)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "LINK\tUP\tFAMILY\tRTT\tJITTER\tLOSS\tTRANSPORT\tTCP CC")
	var notes []string
	for _, st := range r.answers() {
		cc := "-"
		if c := st.Congestion; c != nil {
			cc = orDash(c.Algorithm)
			if c.Fix != "" {
				cc += " (" + c.Reason + ")"
				notes = append(notes, fmt.Sprintf("%s: links run %s, not %s (%s): %s", st.Relay, orDash(c.Algorithm), c.Want, c.Reason, c.Fix))
			}
		}
		for _, p := range st.Peers {
			if n := windowNote(st, p); n != "" {
				notes = append(notes, n)
			}
			up := yesNo(p.Up)
			if p.Draining {
				up = "draining"
			}
			fmt.Fprintf(tw, "%s -> %s\t%s\t%s\t%s\t%s\t%.1f%%\t%s\t%s\n", st.Relay, p.Name, up, orDash(p.Family), dur(p.RTT), dur(p.Jitter), 100*p.Loss, orDash(p.Transport), cc)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CHAIN\tMODE\tROUTE\tCHANGED\tREASON")
	var cands []string
	for _, st := range r.answers() {
		for _, c := range st.Chains {
			changed := "-"
			if !c.Changed.IsZero() {
				changed = r.Time.Sub(c.Changed).Round(time.Second).String() + " ago"
			}
			// A route kept over a cheaper candidate is on it for that
			// reason now, whatever chose it first.
			reason := c.Reason
			if c.Kept != "" {
				reason = c.Kept
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Chain, c.Mode, routeString(c.Route), changed, orDash(reason))
			for _, cd := range c.Candidates {
				cands = append(cands, fmt.Sprintf("%s\t%s\t%s\t%s\t%s", c.Chain, routeString(cd.Route), dur(cd.Cost), dur(cd.Estimated), dur(cd.Measured)))
			}
		}
	}
	if len(cands) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "CANDIDATE OF\tROUTE\tCOST\tESTIMATED\tMEASURED")
		for _, c := range cands {
			fmt.Fprintln(tw, c)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TUNNEL\tENTRY\tLISTEN\tOPEN\tFLOWS\tLIMITS\tERROR")
	for _, st := range r.answers() {
		for _, e := range st.Entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Tunnel, st.Relay, orDash(e.Listen), yesNo(e.Open), e.Flows, orDash(e.Limits), orDash(e.Error))
		}
	}
	if len(r.Imports) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "IMPORT\tCLUSTERSET IP\tPORT\tFROM\tTUNNEL\tCHAIN\tROUTE\tREADY")
		for _, im := range r.Imports {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", im.Service, orDash(strings.Join(im.IPs, ",")), im.Port, im.Cluster,
				im.Tunnel, im.Chain, orDash(strings.Join(im.Route, " -> ")), im.Ready)
		}
	}
	if len(r.API) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "OBJECT\tREADY\tREASON\tMESSAGE")
		for _, o := range r.API {
			fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\n", o.Kind, o.Name, o.Ready, orDash(o.Reason), orDash(o.Message))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintln(w, "\nwarnings:")
		for _, n := range r.Warnings {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	return verdict(w, r, "ready: every relay answers, every chain has a route whose links are up, every Tunnel listens and no exit has failed to reach its target")
}

// verdict ends a report: the ready line, or what is not ready.
func verdict(w io.Writer, r *Report, ready string) error {
	if r.Ready {
		_, err := fmt.Fprintln(w, "\n"+ready)
		return err
	}
	fmt.Fprintln(w, "\nnot ready:")
	for _, n := range r.NotReady {
		fmt.Fprintf(w, "  %s\n", n)
	}
	return nil
}

// WriteProbe renders p like traceroute: a line per hop, then the
// targets, then the route and candidates end to end.
func WriteProbe(w io.Writer, p *Probe) error {
	fmt.Fprintf(w, "chain %s (%s), route %s\n\n", p.Chain, p.Mode, routeString(p.Route))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOP\tLINK\tFAMILY\tRTT\tJITTER\tLOSS\tERROR")
	for i, h := range p.Hops {
		loss, jitter := fmt.Sprintf("%.1f%%", 100*min(h.Loss, 1)), dur(h.Jitter)
		if h.Err != "" {
			// A link that did not answer has no loss or jitter to show.
			loss, jitter = "-", "-"
		}
		fmt.Fprintf(tw, "%d\t%s -> %s\t%s\t%s\t%s\t%s\t%s\n", i+1, h.From, h.To, orDash(h.Family), dur(h.RTT), jitter, loss, orDash(h.Err))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TARGET\tTUNNEL\tCONNECT\tUP\tERROR")
	for _, t := range p.Targets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Target, t.Tunnel, dur(t.RTT), yesNo(t.Up), orDash(t.Error))
	}
	if p.TargetErr != "" {
		fmt.Fprintf(tw, "-\t-\t-\t-\t%s\n", p.TargetErr)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "END TO END\tROUND TRIP\tERROR")
	for i, t := range p.Traces {
		name := routeString(t.Route)
		if i == 0 {
			name += " (route)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, dur(t.RTT), orDash(t.Err))
	}
	return tw.Flush()
}

// answers are the statuses of the relays that answered, in name order.
func (r *Report) answers() []*adminapi.Status {
	var out []*adminapi.Status
	for _, rl := range r.Relays {
		if rl.Status != nil {
			out = append(out, rl.Status)
		}
	}
	return out
}

func routeString(rt []string) string {
	if len(rt) == 0 {
		return "-"
	}
	return strings.Join(rt, " -> ")
}

func dur(d measure.Duration) string {
	if d == 0 {
		return "-"
	}
	x := d.D()
	switch {
	case x < time.Millisecond:
		return x.Round(time.Microsecond).String()
	case x < time.Second:
		return x.Round(10 * time.Microsecond).String()
	}
	return x.Round(time.Millisecond).String()
}

func expires(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	left := t.Sub(now)
	if left < 0 {
		return "EXPIRED " + t.Format(time.DateOnly)
	}
	return fmt.Sprintf("%s (%dd)", t.Format(time.DateOnly), int(left.Hours()/24))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// windowNoteBelow is the rate under which a link's note says that one TLS
// flow cannot carry more: a long link, where the send buffer a socket may
// have runs out before the path is full.
const windowNoteBelow = 100e6

// windowNote says, for a link whose round trip is long enough that one TLS
// flow is bound by the relay's most send buffer below windowNoteBelow, how
// fast one flow can go and what to raise. A TCP socket keeps in flight
// about half of what it may queue (the rest is the kernel's bookkeeping),
// so one flow carries at most SendBuffer/2 per round trip: 4 MiB at 300 ms
// is 56 Mbit/s, what one stream carried in the WAN benchmark.
func windowNote(st *adminapi.Status, p adminapi.Peer) string {
	c, rtt := st.Congestion, p.RTT.D()
	if c == nil || c.SendBuffer <= 0 || rtt <= 0 {
		return ""
	}
	bps := float64(c.SendBuffer) / 2 * 8 / rtt.Seconds()
	if bps >= windowNoteBelow {
		return ""
	}
	return fmt.Sprintf("%s -> %s: one TLS flow carries at most %.0f Mbit/s at this link's %s round trip, since a socket here may queue %s to send "+
		"(net.ipv4.tcp_wmem): raise its third figure where %s runs (a hostNetwork relay: on the node, sysctl -w net.ipv4.tcp_wmem=\"4096 16384 %d\"; "+
		"a relay in a pod network: the pod's securityContext.sysctls), or let bulk ride several flows",
		st.Relay, p.Name, bps/1e6, dur(p.RTT), mib(c.SendBuffer), st.Relay, suggestSendBuffer(rtt))
}

// suggestSendBuffer is a send buffer that lets one flow carry 250 Mbit/s at
// rtt, within 64 MiB: a power of two from 16 MiB. What a flow whose next
// hop stalls may hold in the kernel grows with it (tcp_mem bounds the host).
func suggestSendBuffer(rtt time.Duration) int64 {
	need := int64(2 * 250e6 / 8 * rtt.Seconds())
	b := int64(16 << 20)
	for b < need && b < 64<<20 {
		b *= 2
	}
	return b
}

func mib(b int64) string { return fmt.Sprintf("%g MiB", float64(b)/(1<<20)) }

// writeAPIReport renders a report of the API's view alone (FromAPI).
func writeAPIReport(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "relays not asked: %s\n\n", r.RelaysNotAsked)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OBJECT\tREADY\tREASON\tMESSAGE")
	for _, o := range r.API {
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\n", o.Kind, o.Name, o.Ready, orDash(o.Reason), orDash(o.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return verdict(w, r, "ready, as the API says: every object's Ready condition is True")
}
