package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/pki"
)

// The Limited condition, from what relays report: which limit held the
// Tunnel, where, and what to do; a hit of a limit the Tunnel no longer
// has, an old one, or another Tunnel's does not count; a limit held by
// the relay's own share is named as the relay's.
func TestLimitedCondition(t *testing.T) {
	r := &relayReports{reports: map[types.NamespacedName][]endpointReport{}}
	tn := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "web"},
		Spec: v1alpha1.TunnelSpec{Limits: &v1alpha1.TunnelLimits{RateMbps: 20, MaxFlows: 100}}}
	report := func(relay string, hits ...adminapi.LimitHit) {
		r.reports[types.NamespacedName{Namespace: "edge", Name: relay}] = []endpointReport{
			{endpoint: "10.0.0.1:7401", status: &adminapi.Status{Relay: relay, Limited: hits}}}
	}
	now := time.Now()
	c, expires := r.limited(tn)
	if expires != 0 {
		t.Errorf("no hit, and the condition expires in %v", expires)
	}
	if c.Status != metav1.ConditionFalse || c.Reason != ReasonWithinLimits || !strings.Contains(c.Message, "limits: spec.limits.rateMbps=20, spec.limits.maxFlows=100") {
		t.Errorf("no report: %+v", c)
	}
	report("hk",
		adminapi.LimitHit{Tunnel: "edge/web", Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=50", At: now},                    // before the limit was raised
		adminapi.LimitHit{Tunnel: "edge/web", Reason: adminapi.LimitRateDrop, Limit: "spec.limits.rateMbps=20", At: now.Add(-time.Hour)}, // long ago
		adminapi.LimitHit{Tunnel: "edge/api", Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=100", At: now})                   // another Tunnel
	if c, expires := r.limited(tn); c.Status != metav1.ConditionFalse || expires != 0 {
		t.Errorf("hits that are not this Tunnel's now: %+v", c)
	}
	report("la", adminapi.LimitHit{Tunnel: "edge/web", Reason: adminapi.LimitRateWait, Limit: "spec.limits.rateMbps=20", At: now})
	c, expires = r.limited(tn)
	// Looked at again once the hit is no longer recent: the reports do
	// not change when it merely ages.
	if expires <= recentLimit-time.Minute || expires > recentLimit {
		t.Errorf("a hit just seen expires in %v, want about %v", expires, recentLimit)
	}
	if c.Status != metav1.ConditionTrue || c.Reason != ReasonRateLimited || !strings.Contains(c.Message, "relay la (10.0.0.1:7401) paced TCP flows to spec.limits.rateMbps=20") ||
		!strings.Contains(c.Message, "raise spec.limits.rateMbps") {
		t.Errorf("paced to its rate: %+v", c)
	}
	// Flows refused come first: clients see them.
	report("hk", adminapi.LimitHit{Tunnel: "edge/web", Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=100", At: now})
	c, _ = r.limited(tn)
	if c.Reason != ReasonFlowLimitReached || !strings.Contains(c.Message, "relay hk (10.0.0.1:7401) refused new flows past spec.limits.maxFlows=100") ||
		!strings.Contains(c.Message, "limits.hoplink.dev/max-flows") || !strings.Contains(c.Message, "paced TCP flows") {
		t.Errorf("flows refused and paced: %+v", c)
	}
	// Without spec.limits, only the relay's share holds, and says so.
	free := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "api"}}
	c, _ = r.limited(free)
	if c.Reason != ReasonWithinLimits || !strings.Contains(c.Message, "no spec.limits") {
		t.Errorf("a hit of a spec limit the Tunnel no longer has: %+v", c)
	}
	report("hk", adminapi.LimitHit{Tunnel: "edge/api", Reason: adminapi.LimitFlows, Limit: "--max-flows-per-tunnel=1024", At: now})
	if c, _ := r.limited(free); c.Reason != ReasonFlowLimitReached || !strings.Contains(c.Message, "its own share for one Tunnel (--max-flows-per-tunnel=1024") {
		t.Errorf("the relay's share: %+v", c)
	}
	report("hk", adminapi.LimitHit{Tunnel: "edge/api", Reason: adminapi.LimitFlows, Limit: "click here", At: now})
	if c, _ := r.limited(free); c.Status != metav1.ConditionFalse || strings.Contains(c.Message, "click") {
		t.Errorf("a relay's text that names no limit: %+v", c)
	}
	// A hit is a change the Tunnels see.
	if summary(r.reports[types.NamespacedName{Namespace: "edge", Name: "hk"}]) == summary(nil) {
		t.Error("a limit hit does not change the summary")
	}
}

// A relay that reports a Tunnel held by its limit sets the Tunnel's
// Limited condition, through the operator's rounds of asking relays: a
// stand-in relay answers the admin API as a relay does. It is the chain's
// exit, not its entry (which is never asked here): the Tunnel hears of
// what any relay it crosses reports, not its entry's alone.
func TestTunnelLimitedByWhatRelaysReport(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	var secret corev1.Secret
	if err := k8s.Get(ctx, testCA, &secret); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(secret.Data[keyCert], secret.Data[keyKey])
	if err != nil {
		t.Fatal(err)
	}
	relay := &limitedRelay{name: "rlim"}
	addr := relay.serve(t, ca)
	rn := relayNode(ns, "rlim")
	rn.Spec.Endpoints = []string{addr}
	create(t, rn)
	create(t, relayNode(ns, "rentry"))
	create(t, chain(ns, "c", "rentry", "rlim"))
	tn := tunnel(ns, "web", "c", 8080)
	tn.Spec.Limits = &v1alpha1.TunnelLimits{RateMbps: 20, MaxFlows: 100}
	create(t, tn)
	key := ns + "/web"

	limited := func(what, reason string, status metav1.ConditionStatus, says ...string) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second) // a round every 10 s
		for {
			var got v1alpha1.Tunnel
			err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), &got)
			c := meta.FindStatusCondition(got.Status.Conditions, conditionLimited)
			if err == nil && c != nil && c.Reason == reason && c.Status == status {
				for _, s := range says {
					if !strings.Contains(c.Message, s) {
						t.Errorf("%s: the message does not say %q: %s", what, s, c.Message)
					}
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Limited %+v (%v)", what, c, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	limited("nothing reported", ReasonWithinLimits, metav1.ConditionFalse, "limits: spec.limits.rateMbps=20, spec.limits.maxFlows=100")

	relay.set(adminapi.LimitHit{Tunnel: key, Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=100"})
	limited("flows refused", ReasonFlowLimitReached, metav1.ConditionTrue,
		fmt.Sprintf("relay rlim (%s) refused new flows past spec.limits.maxFlows=100", addr), "raise spec.limits.maxFlows")

	// Raised: the relay's hits of the old limit no longer count.
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), tn); err != nil {
		t.Fatal(err)
	}
	tn.Spec.Limits.MaxFlows = 200
	if err := k8s.Update(ctx, tn); err != nil {
		t.Fatal(err)
	}
	limited("limit raised", ReasonWithinLimits, metav1.ConditionFalse, "spec.limits.maxFlows=200")

	// UDP datagrams dropped at the exit, which is not the entry's report
	// of listening: the Tunnel is still told.
	relay.set(adminapi.LimitHit{Tunnel: key, Reason: adminapi.LimitRateDrop, Limit: "spec.limits.rateMbps=20"})
	limited("datagrams dropped", ReasonRateLimited, metav1.ConditionTrue, "dropped UDP datagrams over spec.limits.rateMbps=20")

	// A relay that stops refusing reports the same hit, growing old: the
	// reports do not change, and the condition clears when it is no
	// longer recent all the same.
	relay.set(adminapi.LimitHit{Tunnel: key, Reason: adminapi.LimitFlows, Limit: "spec.limits.maxFlows=200", At: time.Now().Add(20*time.Second - recentLimit)})
	limited("flows refused, then no more", ReasonFlowLimitReached, metav1.ConditionTrue, "spec.limits.maxFlows=200")
	limited("the last refusal no longer recent", ReasonWithinLimits, metav1.ConditionFalse)
}

// limitedRelay answers the admin API's status as a relay named name whose
// Limited are the hits set last, each as just seen unless it has a time.
type limitedRelay struct {
	name string
	mu   sync.Mutex
	hits []adminapi.LimitHit
}

func (l *limitedRelay) set(hits ...adminapi.LimitHit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hits = hits
}

func (l *limitedRelay) Status(context.Context, string) (*adminapi.Status, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &adminapi.Status{Relay: l.name, Ready: true}
	for _, h := range l.hits {
		if h.At.IsZero() {
			h.At = time.Now()
		}
		h.Count = 1
		s.Limited = append(s.Limited, h)
	}
	return s, nil
}

func (l *limitedRelay) Links(context.Context, string, string, time.Duration) (*measure.Table, error) {
	return nil, adminapi.NotFound("test", fmt.Errorf("no links"))
}

func (l *limitedRelay) Trace(context.Context, string, string, [][]string) ([]measure.Trace, error) {
	return nil, adminapi.NotFound("test", fmt.Errorf("no traces"))
}

func (l *limitedRelay) ClusterSet(context.Context, string, string, time.Duration) ([]byte, string, error) {
	return nil, "", adminapi.NotFound("test", fmt.Errorf("no clusterset"))
}

// serve serves the admin API over mutual TLS as the relay's certificate
// presents it, on a loopback port, and returns its address.
func (l *limitedRelay) serve(t *testing.T, ca *pki.CA) string {
	t.Helper()
	id, err := ca.Identity(l.name)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: adminapi.Handler(l)}
	go srv.Serve(handshaken{tls.NewListener(ln, id.ServerConfig(nil, pki.AdminALPN))})
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// handshaken completes each connection's handshake before the HTTP
// server sees it, as a relay does, and hides the TLS connection from it:
// the server would otherwise look for a handler of the admin protocol's
// ALPN name and close the connection.
type handshaken struct{ net.Listener }

type plainConn struct{ net.Conn }

func (l handshaken) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if err := c.(*tls.Conn).Handshake(); err != nil {
			c.Close()
			continue
		}
		return plainConn{c}, nil
	}
}

// A relay names at most adminapi.MaxLimited Tunnels held by a limit: one
// that names more (a sidecar relay runs in a tenant's pod) has no more of
// them requeued, each round its report changes.
func TestLimitedTunnelsBounded(t *testing.T) {
	rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "side"}}
	var hits []adminapi.LimitHit
	for i := range 10 * adminapi.MaxLimited {
		hits = append(hits, adminapi.LimitHit{Tunnel: fmt.Sprintf("edge/t%d", i), Reason: adminapi.LimitFlows, At: time.Now()})
	}
	got := limitedTunnels(rn, []endpointReport{{endpoint: "10.0.0.1:7401", status: &adminapi.Status{Limited: hits}}})
	if len(got) > adminapi.MaxLimited {
		t.Errorf("a report naming %d Tunnels requeues %d, want at most %d", len(hits), len(got), adminapi.MaxLimited)
	}
}
