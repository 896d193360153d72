package controllers

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// limited is a TCP or UDP Tunnel's Limited condition. True while a relay
// it crosses reported it held by one of its limits within recentLimit:
// FlowLimitReached for new flows refused (which clients see as resets),
// else RateLimited for datagrams dropped or TCP flows paced to its rate;
// the message names the limit, the relays and what to do. Else False,
// WithinLimits. Either way the message says the limits the Tunnel runs
// with: a namespace's defaults are written into spec.limits when the
// Tunnel is, so spec.limits is what the relays hold it to.
//
// A hit of a limit the Tunnel no longer has (its spec was changed since)
// is not counted, so raising a limit clears the condition at once. The
// message holds no counts or times, so that the status is written only
// when the condition changes; the relays' metrics have the figures.
// expires is how long until the latest hit counted is no longer recent
// (0 without one): the reports do not change when a hit merely ages, so
// the Tunnel is looked at again then.
func (r *relayReports) limited(t *v1alpha1.Tunnel) (_ metav1.Condition, expires time.Duration) {
	var l v1alpha1.TunnelLimits
	if t.Spec.Limits != nil {
		l = *t.Spec.Limits
	}
	var flowsLimit, rateLimit string
	var has []string
	if l.RateMbps > 0 {
		rateLimit = fmt.Sprintf("spec.limits.rateMbps=%d", l.RateMbps)
		has = append(has, rateLimit)
	}
	if l.MaxFlows > 0 {
		flowsLimit = fmt.Sprintf("spec.limits.maxFlows=%d", l.MaxFlows)
		has = append(has, flowsLimit)
	}
	limits := "limits: " + strings.Join(has, ", ")
	if len(has) == 0 {
		limits = "no spec.limits: the relays hold the Tunnel only to their own share for one Tunnel (--max-flows-per-tunnel)"
	}

	// Where each limit held, by reason and limit: "relay (endpoint)".
	flows, drops, waits := map[string][]string{}, map[string][]string{}, map[string][]string{}
	key := manifest.Key(t.Namespace, t.Name)
	for _, rel := range r.namespaceReports(t.Namespace) {
		for _, e := range rel.reports {
			if e.status == nil {
				continue
			}
			where := fmt.Sprintf("%s (%s)", rel.name, e.endpoint)
			for _, h := range e.status.Limited {
				if h.Tunnel != key || time.Since(h.At) >= recentLimit {
					continue
				}
				switch {
				case h.Reason == adminapi.LimitFlows && (h.Limit == flowsLimit || relayShare.MatchString(h.Limit)):
					flows[h.Limit] = appendNew(flows[h.Limit], where)
				case h.Reason == adminapi.LimitRateDrop && rateLimit != "" && h.Limit == rateLimit:
					drops[h.Limit] = appendNew(drops[h.Limit], where)
				case h.Reason == adminapi.LimitRateWait && rateLimit != "" && h.Limit == rateLimit:
					waits[h.Limit] = appendNew(waits[h.Limit], where)
				default:
					continue
				}
				expires = max(expires, recentLimit-time.Since(h.At))
			}
		}
	}

	var held []string
	for _, lim := range slices.Sorted(maps.Keys(flows)) {
		at := "relay " + strings.Join(flows[lim], ", ")
		if strings.HasPrefix(lim, "spec.limits.") {
			held = append(held, fmt.Sprintf("%s refused new flows past %s (hoplink_flow_errors_total, reason tunnel_limit): raise spec.limits.maxFlows (within the namespace's label limits.hoplink.dev/max-flows, if it has one) or have clients open fewer flows at once", at, lim))
		} else {
			held = append(held, fmt.Sprintf("%s refused new flows past its own share for one Tunnel (%s, hoplink_flow_errors_total, reason tunnel_limit), below the Tunnel's limits: raise the relay's --max-flows-per-tunnel or have clients open fewer flows at once", at, lim))
		}
	}
	var rate []string
	if len(drops) > 0 {
		rate = append(rate, fmt.Sprintf("relay %s dropped UDP datagrams over %s (hoplink_udp_dropped_packets_total, reason rate_limit)", strings.Join(drops[rateLimit], ", "), rateLimit))
	}
	if len(waits) > 0 {
		rate = append(rate, fmt.Sprintf("relay %s paced TCP flows to %s (hoplink_tunnel_rate_wait_seconds_total)", strings.Join(waits[rateLimit], ", "), rateLimit))
	}
	if len(rate) > 0 {
		held = append(held, strings.Join(rate, "; ")+": the Tunnel sends at its limit; raise spec.limits.rateMbps (within the namespace's label limits.hoplink.dev/max-rate-mbps, if it has one) if it needs more")
	}

	c := metav1.Condition{Type: conditionLimited, Status: metav1.ConditionFalse, Reason: ReasonWithinLimits,
		Message: fmt.Sprintf("no relay reports the Tunnel held by a limit in the last %v; %s", recentLimit, limits)}
	if len(held) > 0 {
		c.Status, c.Reason = metav1.ConditionTrue, ReasonRateLimited
		if len(flows) > 0 {
			c.Reason = ReasonFlowLimitReached
		}
		c.Message = strings.Join(held, "; ") + ". " + limits
	}
	if len(c.Message) > 1024 {
		c.Message = c.Message[:1021] + "..."
	}
	return c, expires
}

// relayShare is how a relay names its own share of flows for one Tunnel:
// nothing else a relay says is copied into the condition.
var relayShare = regexp.MustCompile(`^--max-flows-per-tunnel=[0-9]+$`)

// relayReport is one RelayNode's reports.
type relayReport struct {
	name    string
	reports []endpointReport
}

// namespaceReports are the reports of the RelayNodes of a namespace (the
// relays its Chains, and so its Tunnels, cross), by name.
func (r *relayReports) namespaceReports(ns string) []relayReport {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []relayReport
	for k, reports := range r.reports {
		if k.Namespace == ns {
			out = append(out, relayReport{k.Name, slices.Clone(reports)})
		}
	}
	slices.SortFunc(out, func(a, b relayReport) int { return cmp.Compare(a.name, b.name) })
	return out
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
