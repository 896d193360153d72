package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// relayReports asks every relay the operator runs what only it can see go
// wrong (adminapi.Status: Tunnel entries that cannot open, targets that
// refuse, handshakes refused, devices that cannot open), keeps the answers
// for the Tunnel and RelayNode reconcilers, which turn them into
// conditions, and records an Event when a problem is new. It runs on the
// leader, every reportEvery.
type relayReports struct {
	client   client.Reader
	admin    *relayAdmin
	recorder recorder.EventRecorder
	every    time.Duration
	// askTimeout bounds one relay's answer.
	askTimeout time.Duration

	// Reconciles of the objects whose report changed.
	tunnels, relays chan event.GenericEvent

	mu      sync.Mutex
	reports map[types.NamespacedName][]endpointReport // by RelayNode
	seen    map[string]int64                          // problem counts already told as Events
}

// endpointReport is one relay pod's answer.
type endpointReport struct {
	endpoint string
	status   *adminapi.Status
	err      error
}

// reportEvery is how often relays are asked; recentProblem is how long a
// problem keeps a RelayNode's RelaysHealthy condition False.
const (
	reportEvery   = 10 * time.Second
	recentProblem = 10 * time.Minute
	// recentLimit is how long a limit that held keeps a Tunnel's Limited
	// condition True: a Tunnel at its limit in bursts stays Limited
	// between them, and one that stopped is told within minutes.
	recentLimit = 5 * time.Minute
	askTimeout  = 3 * time.Second
	// reportParallel bounds the RelayNodes asked at once: their endpoints
	// are asked at once too, a few each (measuredReplicas of a sidecar's).
	reportParallel = 16
)

func newRelayReports(c client.Reader, admin *relayAdmin, rec recorder.EventRecorder) *relayReports {
	return &relayReports{client: c, admin: admin, recorder: rec, every: reportEvery, askTimeout: askTimeout,
		tunnels: make(chan event.GenericEvent, 256), relays: make(chan event.GenericEvent, 256),
		reports: map[types.NamespacedName][]endpointReport{}, seen: map[string]int64{}}
}

// NeedLeaderElection: one operator replica asks, the leader.
func (r *relayReports) NeedLeaderElection() bool { return true }

// Start asks the relays every r.every until ctx ends.
func (r *relayReports) Start(ctx context.Context) error {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		r.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// round asks every relay once and tells the reconcilers what changed.
// RelayNodes are asked reportParallel at once, so that relays that do not
// answer (each takes askTimeout) delay the others' conditions by one
// timeout, not one each.
func (r *relayReports) round(ctx context.Context) {
	var list v1alpha1.RelayNodeList
	if err := r.client.List(ctx, &list); err != nil {
		return
	}
	sem := make(chan struct{}, reportParallel)
	var wg sync.WaitGroup
	for i := range list.Items {
		rn := &list.Items[i]
		if rn.Spec.External || len(rn.Status.Endpoints) == 0 {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.ask(ctx, rn)
		}()
	}
	wg.Wait()
}

// ask asks one RelayNode's relays, each endpoint at once.
func (r *relayReports) ask(ctx context.Context, rn *v1alpha1.RelayNode) {
	key := client.ObjectKeyFromObject(rn)
	eps := oneFamily(rn.Status.Endpoints)
	if rn.Spec.IsSidecar() {
		eps = eps[:min(len(eps), measuredReplicas)]
	}
	got := make([]endpointReport, len(eps))
	var wg sync.WaitGroup
	for j, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, r.askTimeout)
			defer cancel()
			s, err := r.admin.api.Status(cctx, rn.Name, ep)
			got[j] = endpointReport{endpoint: ep, status: s, err: err}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	old := r.reports[key]
	r.reports[key] = got
	r.mu.Unlock()
	if summary(old) != summary(got) {
		select {
		case r.relays <- event.GenericEvent{Object: rn}:
		default: // the next round will
		}
		r.touchTunnels(ctx, rn, limitedTunnels(rn, old, got))
	}
	r.tell(ctx, rn, got)
}

// touchTunnels requeues the Tunnels that enter at a relay whose report
// changed, and those it names as held by a limit (limited). Each is sent,
// not dropped when the channel is full: a report changes once, and the
// next round would not send it again.
func (r *relayReports) touchTunnels(ctx context.Context, rn *v1alpha1.RelayNode, limited []types.NamespacedName) {
	keys := limited
	seen := map[types.NamespacedName]bool{}
	for _, k := range limited {
		seen[k] = true
	}
	for _, req := range tunnelsAt(ctx, r.client, rn.Namespace, rn.Name, false) {
		if !seen[req.NamespacedName] {
			keys = append(keys, req.NamespacedName)
		}
	}
	for _, k := range keys {
		t := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
		select {
		case r.tunnels <- event.GenericEvent{Object: t}:
		case <-ctx.Done():
			return
		}
	}
}

// summary is what the conditions are computed from, to see a change.
func summary(reports []endpointReport) string {
	var b strings.Builder
	for _, e := range reports {
		fmt.Fprintf(&b, "%s:%v|", e.endpoint, e.err != nil)
		if e.status == nil {
			continue
		}
		for _, en := range e.status.Entries {
			fmt.Fprintf(&b, "%s=%v %s;", en.Tunnel, en.Open, en.Error)
		}
		for _, p := range e.status.Problems {
			if time.Since(p.At) < recentProblem {
				fmt.Fprintf(&b, "%s/%s;", p.Kind, p.Tunnel)
			}
		}
		if c := e.status.Congestion; c != nil {
			fmt.Fprintf(&b, "cc=%s/%s;", c.Algorithm, c.Reason)
		}
		for _, h := range e.status.Limited {
			if time.Since(h.At) < recentLimit {
				fmt.Fprintf(&b, "lim=%s/%s/%s;", h.Tunnel, h.Reason, h.Limit)
			}
		}
	}
	return b.String()
}

// limitedTunnels are the Tunnels of rn's namespace that reports name as
// held by a limit: their Limited condition follows the reports of every
// relay they cross, not only their entry's.
func limitedTunnels(rn *v1alpha1.RelayNode, reports ...[]endpointReport) []types.NamespacedName {
	var out []types.NamespacedName
	for _, rs := range reports {
		for _, e := range rs {
			if e.status == nil {
				continue
			}
			// A relay reports at most MaxLimited; one that says more
			// (a sidecar's, in a tenant's pod) gets no more requeued.
			for _, h := range e.status.Limited[:min(len(e.status.Limited), adminapi.MaxLimited)] {
				ns, name, ok := strings.Cut(h.Tunnel, "/")
				k := types.NamespacedName{Namespace: ns, Name: name}
				if ok && ns == rn.Namespace && !slices.Contains(out, k) {
					out = append(out, k)
				}
			}
		}
	}
	return out
}

// tell records an Event for each problem a relay counted since the last
// round: on the Tunnel it concerns, else on the RelayNode.
func (r *relayReports) tell(ctx context.Context, rn *v1alpha1.RelayNode, reports []endpointReport) {
	for _, e := range reports {
		if e.status == nil {
			continue
		}
		for _, en := range e.status.Entries {
			if en.Error == "" {
				continue
			}
			k := "listen/" + e.endpoint + "/" + en.Tunnel
			r.mu.Lock()
			told := r.seen[k] > 0
			r.seen[k] = 1
			r.mu.Unlock()
			if !told {
				r.event(ctx, rn, en.Tunnel, ReasonListenFailed, "relay %s at %s cannot open the Tunnel's entry: %s", rn.Name, e.endpoint, en.Error)
			}
		}
		for _, p := range e.status.Problems {
			k := p.Kind + "/" + e.endpoint + "/" + p.Tunnel
			r.mu.Lock()
			before := r.seen[k]
			r.seen[k] = p.Count
			r.mu.Unlock()
			if p.Count <= before {
				continue
			}
			reason := map[string]string{adminapi.ProblemDialTarget: ReasonTargetRefused, adminapi.ProblemHandshake: ReasonHandshakeRefused,
				adminapi.ProblemDevice: ReasonDeviceFailed, adminapi.ProblemEgress: ReasonEgressRefused}[p.Kind]
			r.event(ctx, rn, p.Tunnel, reason, "relay %s at %s, %d more time(s): %s", rn.Name, e.endpoint, p.Count-before, p.Last)
		}
	}
	r.mu.Lock()
	if len(r.seen) > 4*adminapi.MaxProblems*max(1, len(reports)) {
		clear(r.seen) // bounded: at worst a problem is told again
	}
	r.mu.Unlock()
}

func (r *relayReports) event(ctx context.Context, rn *v1alpha1.RelayNode, tunnel, reason, format string, args ...any) {
	var obj client.Object = rn
	if ns, name, ok := strings.Cut(tunnel, "/"); ok && ns == rn.Namespace {
		var t v1alpha1.Tunnel
		if r.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &t) == nil {
			obj = &t
		}
	}
	r.recorder.Eventf(obj, nil, corev1.EventTypeWarning, reason, "Relay", format, args...)
}

// listening is a Tunnel's Listening condition from its entry relays'
// reports, and on how many the entry is open; nil before any answered.
func (r *relayReports) listening(t *v1alpha1.Tunnel, entry string) (*metav1.Condition, int) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	reports := slices.Clone(r.reports[types.NamespacedName{Namespace: t.Namespace, Name: entry}])
	r.mu.Unlock()
	key := manifest.Key(t.Namespace, t.Name)
	open, asked := 0, 0
	var failures []string
	for _, e := range reports {
		if e.status == nil {
			continue
		}
		for _, en := range e.status.Entries {
			if en.Tunnel != key {
				continue
			}
			asked++
			if en.Open {
				open++
			} else if en.Error != "" {
				failures = append(failures, fmt.Sprintf("relay %s at %s: %s", entry, e.endpoint, en.Error))
			} else {
				failures = append(failures, fmt.Sprintf("relay %s at %s: not open (it drains, or has not applied the Tunnel yet)", entry, e.endpoint))
			}
		}
	}
	if asked == 0 {
		return nil, 0
	}
	c := &metav1.Condition{Type: conditionListening, Status: metav1.ConditionTrue, Reason: ReasonListening,
		Message: fmt.Sprintf("open on %d of %d entry relays", open, asked)}
	if open < asked {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonListenFailed
		c.Message = fmt.Sprintf("open on %d of %d entry relays; %s; free the port on that node or change spec.listen (the relay retries every 5 s)",
			open, asked, strings.Join(failures, "; "))
	}
	return c, open
}

// healthy is a RelayNode's RelaysHealthy condition from its relays'
// reports (problems of the last recentProblem), or nil before any answer.
func (r *relayReports) healthy(rn *v1alpha1.RelayNode) *metav1.Condition {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	reports := slices.Clone(r.reports[client.ObjectKeyFromObject(rn)])
	r.mu.Unlock()
	answered, troubled := 0, 0
	var seen []string
	for _, e := range reports {
		if e.status == nil {
			continue
		}
		answered++
		var mine []string
		for _, en := range e.status.Entries {
			if en.Error != "" {
				mine = append(mine, fmt.Sprintf("Tunnel %s cannot open: %s", en.Tunnel, en.Error))
			}
		}
		for _, p := range e.status.Problems {
			if time.Since(p.At) < recentProblem {
				what := p.Kind
				if p.Tunnel != "" {
					what += " (" + p.Tunnel + ")"
				}
				mine = append(mine, fmt.Sprintf("%s x%d, last: %s", what, p.Count, p.Last))
			}
		}
		if len(mine) > 0 {
			troubled++
			seen = append(seen, e.endpoint+": "+strings.Join(mine, "; "))
		}
	}
	if answered == 0 {
		return nil
	}
	if troubled == 0 {
		return &metav1.Condition{Type: conditionRelaysHealthy, Status: metav1.ConditionTrue, Reason: ReasonNoProblems,
			Message: fmt.Sprintf("%d relays answered; none reports a problem in the last %v", answered, recentProblem)}
	}
	msg := fmt.Sprintf("%d of %d relays report problems: %s", troubled, answered, strings.Join(seen, " | "))
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return &metav1.Condition{Type: conditionRelaysHealthy, Status: metav1.ConditionFalse, Reason: ReasonRelayProblems, Message: msg}
}

// congestion is a RelayNode's CongestionControl condition from its
// relays' reports: whether their TLS links run the TCP congestion control
// spec.links.congestionControl asks for (bbr under auto), and if not, on
// which relays, why and what to do; nil before any answer.
func (r *relayReports) congestion(rn *v1alpha1.RelayNode) *metav1.Condition {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	reports := slices.Clone(r.reports[client.ObjectKeyFromObject(rn)])
	r.mu.Unlock()
	answered, running := 0, map[string]int{}
	var refused []string
	fix := ""
	for _, e := range reports {
		if e.status == nil || e.status.Congestion == nil {
			continue
		}
		c := e.status.Congestion
		answered++
		if c.Fix == "" {
			running[c.Algorithm]++
			continue
		}
		refused = append(refused, fmt.Sprintf("%s runs %s (%s)", e.endpoint, c.Algorithm, c.Reason))
		fix = c.Fix
	}
	if answered == 0 {
		return nil
	}
	if len(refused) == 0 {
		var runs []string
		for alg, n := range running {
			runs = append(runs, fmt.Sprintf("%s on %d", alg, n))
		}
		slices.Sort(runs)
		return &metav1.Condition{Type: conditionCongestionControl, Status: metav1.ConditionTrue, Reason: ReasonCongestionControlAsked,
			Message: fmt.Sprintf("the relays' TLS links run what spec.links.congestionControl (%s) asks: %s of %d relays", rn.Spec.LinkCongestionControl(), strings.Join(runs, ", "), answered)}
	}
	msg := fmt.Sprintf("%d of %d relays cannot run what spec.links.congestionControl (%s) asks and run the host's default: %s. To fix: %s",
		len(refused), answered, rn.Spec.LinkCongestionControl(), strings.Join(refused, "; "), fix)
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return &metav1.Condition{Type: conditionCongestionControl, Status: metav1.ConditionFalse, Reason: ReasonCongestionControlRefused, Message: msg}
}

// Condition types the reports set, beside Ready.
const (
	conditionListening         = "Listening"
	conditionLimited           = "Limited"
	conditionRelaysHealthy     = "RelaysHealthy"
	conditionCongestionControl = "CongestionControl"
)
