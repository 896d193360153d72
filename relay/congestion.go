package relay

import (
	"os"
	"strconv"
	"strings"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/nexthop"
)

// congestionFor decides what the relay's TLS links run under set's
// RelayNode (spec.links.congestionControl), and says so when it changes:
// in the log (a warning with what to do when the relay cannot have what
// it asked for) and in hoplink_link_congestion_control_info. The relays,
// not the hosts, own the congestion control of the legs between them: a
// chain splits one long lossy path into legs that only pay if each runs
// a control that keeps its rate under loss.
func (r *Relay) congestionFor(set *manifest.Set) (nexthop.Congestion, bool) {
	want := set.Relay(r.cfg.Name).Spec.LinkCongestionControl()
	if old := r.congestion.Load(); old != nil && old.Want == want {
		return *old, false
	}
	c := nexthop.ChooseCongestion(want)
	r.congestion.Store(&c)
	m := r.cfg.Metrics.LinkCongestion
	m.DeletePartialMatch(map[string]string{"from": r.cfg.Name})
	m.WithLabelValues(r.cfg.Name, c.Algorithm, c.Reason).Set(1)
	if c.Wanted() {
		r.cfg.Log.Info("links' congestion control", "want", c.Want, "algorithm", c.Algorithm, "reason", c.Reason,
			"send_buffer_max", sendBufferMax())
	} else {
		r.cfg.Log.Warn("links' congestion control is not the one asked for", "want", c.Want, "algorithm", c.Algorithm,
			"reason", c.Reason, "fix", c.Fix, "send_buffer_max", sendBufferMax())
	}
	return c, true
}

// congestionStatus is the links' congestion control for the admin API.
func (r *Relay) congestionStatus() *adminapi.Congestion {
	c := r.congestion.Load()
	if c == nil {
		return nil
	}
	return &adminapi.Congestion{Want: c.Want, Algorithm: c.Algorithm, Reason: c.Reason, Fix: c.Fix, SendBuffer: sendBufferMax()}
}

// sendBufferMax is the most the kernel's autotuning gives a TCP socket of
// this network namespace to send (net.ipv4.tcp_wmem's third figure), 0
// where it cannot be read. The relay does not raise it past that: setting
// SO_SNDBUF is capped by net.core.wmem_max (200 KiB on a stock host) and
// turns the autotuning off, so it would shrink most links' buffers.
func sendBufferMax() int64 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0
	}
	v, _ := strconv.ParseInt(f[2], 10, 64)
	return v
}
