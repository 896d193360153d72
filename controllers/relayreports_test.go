package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/pki"
)

// The conditions come from what the relays said: how many entry relays
// listen, and which relays saw what go wrong lately.
func TestRelayReportsConditions(t *testing.T) {
	r := &relayReports{reports: map[types.NamespacedName][]endpointReport{}}
	tn := &v1alpha1.Tunnel{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "web"}}
	hk := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "hk"}}
	if c, _ := r.listening(tn, "hk"); c != nil || r.healthy(hk) != nil {
		t.Fatal("conditions before any relay answered")
	}
	key := types.NamespacedName{Namespace: "edge", Name: "hk"}
	r.reports[key] = []endpointReport{
		{endpoint: "10.0.0.1:7401", status: &adminapi.Status{Relay: "hk", Entries: []adminapi.Entry{{Tunnel: "edge/web", Open: true}}}},
		{endpoint: "10.0.0.2:7401", status: &adminapi.Status{Relay: "hk", Entries: []adminapi.Entry{{Tunnel: "edge/web", Error: "listen tcp :80: bind: address already in use"}},
			Problems: []adminapi.Problem{{Kind: adminapi.ProblemDialTarget, Tunnel: "edge/web", Count: 4, Last: "connection refused", At: time.Now()}}}},
		{endpoint: "10.0.0.3:7401", err: errors.New("timeout")},
	}
	c, open := r.listening(tn, "hk")
	if c == nil || open != 1 || c.Status != metav1.ConditionFalse || c.Reason != "ListenFailed" ||
		!strings.Contains(c.Message, "open on 1 of 2 entry relays") || !strings.Contains(c.Message, "10.0.0.2:7401") || !strings.Contains(c.Message, "already in use") {
		t.Errorf("listening %+v, open %d", c, open)
	}
	h := r.healthy(hk)
	if h == nil || h.Status != metav1.ConditionFalse || !strings.Contains(h.Message, "1 of 2 relays report problems") ||
		!strings.Contains(h.Message, "dial_target (edge/web) x4") || !strings.Contains(h.Message, "cannot open") {
		t.Errorf("healthy %+v", h)
	}

	// Every entry open, problems long past: all well.
	r.reports[key] = []endpointReport{{endpoint: "10.0.0.1:7401", status: &adminapi.Status{Relay: "hk",
		Entries:  []adminapi.Entry{{Tunnel: "edge/web", Open: true}},
		Problems: []adminapi.Problem{{Kind: adminapi.ProblemHandshake, Count: 1, Last: "old", At: time.Now().Add(-time.Hour)}}}}}
	if c, open := r.listening(tn, "hk"); c == nil || c.Status != metav1.ConditionTrue || open != 1 {
		t.Errorf("all open: %+v", c)
	}
	if h := r.healthy(hk); h == nil || h.Status != metav1.ConditionTrue {
		t.Errorf("no recent problem: %+v", h)
	}
	if summary(r.reports[key]) == summary(nil) {
		t.Error("a report and none summarize alike: a change would go unseen")
	}
}

// The CongestionControl condition says whether the relays' TLS links run
// what the RelayNode asks, and where not, which relays, why and the fix.
func TestCongestionControlCondition(t *testing.T) {
	r := &relayReports{reports: map[types.NamespacedName][]endpointReport{}}
	hk := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "hk"}}
	key := types.NamespacedName{Namespace: "edge", Name: "hk"}
	if r.congestion(hk) != nil {
		t.Fatal("a condition before any relay answered")
	}
	bbr := &adminapi.Congestion{Want: "auto", Algorithm: "bbr", Reason: "auto"}
	r.reports[key] = []endpointReport{
		{endpoint: "10.0.0.1:7401", status: &adminapi.Status{Relay: "hk", Congestion: bbr}},
		{endpoint: "10.0.0.3:7401", err: errors.New("timeout")},
	}
	before := summary(r.reports[key])
	if c := r.congestion(hk); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonCongestionControlAsked || !strings.Contains(c.Message, "bbr on 1 of 1 relays") {
		t.Errorf("every relay on bbr: %+v", c)
	}
	r.reports[key] = append(r.reports[key], endpointReport{endpoint: "10.0.0.2:7401", status: &adminapi.Status{Relay: "hk",
		Congestion: &adminapi.Congestion{Want: "auto", Algorithm: "cubic", Reason: "not_allowed", Fix: "add bbr to net.ipv4.tcp_allowed_congestion_control"}}})
	c := r.congestion(hk)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonCongestionControlRefused ||
		!strings.Contains(c.Message, "1 of 2 relays") || !strings.Contains(c.Message, "10.0.0.2:7401 runs cubic (not_allowed)") ||
		!strings.Contains(c.Message, "tcp_allowed_congestion_control") {
		t.Errorf("one relay refused bbr: %+v", c)
	}
	if summary(r.reports[key]) == before {
		t.Error("a relay's congestion control changed and the summary did not: the condition would not follow")
	}
}

// Relays that do not answer delay a round by one timeout, not one each:
// 20 RelayNodes whose endpoint accepts and stays silent, asked with a
// 300 ms timeout, take about 600 ms, two waves of reportParallel (before:
// one after another, 6 s; 60 s at the real 3 s timeout).
func TestReportRoundAsksRelaysAtOnce(t *testing.T) {
	silent := serveLoopback(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	var objs []client.Object
	for i := range 20 {
		rn := &v1alpha1.RelayNode{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: fmt.Sprintf("r%d", i)}}
		rn.Status.Endpoints = []string{silent}
		objs = append(objs, rn)
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).WithStatusSubresource(objs...).
		WithIndex(&v1alpha1.Chain{}, indexChainRelays, func(client.Object) []string { return nil }).Build()
	ca, _ := pki.NewCA("test")
	r := newRelayReports(c, newRelayAdmin(c, ca), nil)
	r.askTimeout = 300 * time.Millisecond
	start := time.Now()
	r.round(context.Background())
	took := time.Since(start)
	if len(r.reports) != 20 {
		t.Fatalf("%d RelayNodes asked, want 20", len(r.reports))
	}
	if took > 4*time.Second { // 0.6 s and a busy host's delays
		t.Fatalf("a round of 20 silent relays took %v", took)
	}
}
