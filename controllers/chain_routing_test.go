package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/route"
	"github.com/hoplink/hoplink/routectl"
)

// These tests need no API server: they pin down the pure parts of the
// reconcilers.

func link(to string, up bool, rtt time.Duration) measure.Link {
	return measure.Link{To: to, Up: up, RTT: measure.Duration(rtt)}
}

// A RelayNode with several relays answers once per relay; each link and
// target takes the median of the relays that reached it.
func TestMergeTablesTakesTheMedianOfRelaysUp(t *testing.T) {
	ms := time.Millisecond
	tables := []*measure.Table{
		{Relay: "la", Links: []measure.Link{link("useast", true, 30*ms), link("seattle", false, 0)},
			Targets: []measure.Target{{Tunnel: "default/t", Up: true, RTT: measure.Duration(ms)}}},
		{Relay: "la", Links: []measure.Link{link("useast", true, 10*ms), link("seattle", false, 0)}},
		{Relay: "la", Links: []measure.Link{link("useast", false, 0), link("seattle", true, 7*ms)},
			Targets: []measure.Target{{Tunnel: "default/t", Up: false}}},
		{Relay: "la", Links: []measure.Link{link("useast", true, 20*ms)}},
	}
	got := mergeTables(tables)
	if got.Relay != "la" || len(got.Links) != 2 || len(got.Targets) != 1 {
		t.Fatalf("merged %+v", got)
	}
	want := map[string]measure.Link{"useast": link("useast", true, 20*ms), "seattle": link("seattle", true, 7*ms)}
	for _, l := range got.Links {
		if w := want[l.To]; l.Up != w.Up || l.RTT != w.RTT {
			t.Errorf("link to %s: %+v, want %+v", l.To, l, w)
		}
	}
	if tg := got.Targets[0]; !tg.Up || tg.RTT.D() != ms {
		t.Errorf("target %+v: the relay that reached it counts", tg)
	}
	down := mergeTables([]*measure.Table{{Relay: "la", Links: []measure.Link{link("x", false, 0)}}, {Relay: "la", Links: []measure.Link{link("x", false, 0)}}})
	if down.Links[0].Up {
		t.Errorf("a link down everywhere came out up: %+v", down.Links[0])
	}
	if one := mergeTables(tables[:1]); one != tables[0] {
		t.Error("a single table is not taken as it is")
	}
}

func TestMergeTracesKeepsEveryErrorOrTheMedian(t *testing.T) {
	routes := [][]string{{"hk", "la"}, {"hk", "seattle", "la"}}
	ms := measure.Duration(time.Millisecond)
	answers := [][]measure.Trace{
		{{Route: routes[0], RTT: 5 * ms}, {Route: routes[1], Err: "timed out"}},
		{{Route: routes[0], RTT: 9 * ms}, {Route: routes[1], Err: "reset"}},
		{{Route: routes[0], RTT: 6 * ms}, {Route: routes[1], Err: "refused"}},
	}
	got := mergeTraces(routes, answers)
	if got[0].RTT != 6*ms || got[0].Err != "" {
		t.Errorf("route 0: %+v, want the median 6ms", got[0])
	}
	if got[1].RTT != 0 || !strings.Contains(got[1].Err, "timed out") || !strings.Contains(got[1].Err, "refused") {
		t.Errorf("route 1: %+v, want every relay's error", got[1])
	}
}

func TestRoutingStatus(t *testing.T) {
	ch := &v1alpha1.Chain{}
	ch.Status.RouteChanges = 2
	ms := time.Millisecond
	var cands []route.Path
	for i := range 12 {
		cands = append(cands, route.Path{Relays: []string{"hk", "la"}, Estimated: time.Duration(i+1)*ms + 42*time.Microsecond})
	}
	d := routectl.Decision{Chain: "default/c", Route: []string{"hk", "la"}, Estimated: 3*ms + 260*time.Microsecond, Measured: 4 * ms, Candidates: cands}
	s := routingStatus(ch, d)
	if strings.Join(s.Route, ",") != "hk,la" || s.Latency.Estimated.Duration != 3300*time.Microsecond || s.Latency.Measured.Duration != 4*ms {
		t.Fatalf("status %+v", s)
	}
	if len(s.Candidates) != 9 || s.Candidates[0].Latency.Measured != nil || s.Candidates[8].Latency.Estimated.Duration != 9*ms {
		t.Fatalf("candidates %+v", s.Candidates)
	}
	if s.LastRouteChange != nil || s.RouteChanges != 2 {
		t.Fatal("a round without a change counted one")
	}
	d.Changed = true
	if s := routingStatus(ch, d); s.LastRouteChange == nil || s.RouteChanges != 3 {
		t.Fatalf("a change was not counted: %+v", s)
	}
	if ch.Status.RouteChanges != 2 {
		t.Fatal("routingStatus wrote into the Chain it was given")
	}
}

func TestStatusWritesAreDue(t *testing.T) {
	w := &routeWriter{written: map[string]time.Time{}}
	ch := &v1alpha1.Chain{}
	ch.Status.Route = []string{"hk", "la"}
	ch.Status.Latency = latency(3*time.Millisecond, 0)
	d := routectl.Decision{Chain: "default/c", Route: []string{"hk", "la"}, Estimated: 3 * time.Millisecond}
	same := routingStatus(ch, d)
	w.written["default/c"] = time.Now()
	if w.due(ch, same, d) {
		t.Error("an unchanged status is written again")
	}
	d.Estimated = 4 * time.Millisecond
	if w.due(ch, routingStatus(ch, d), d) {
		t.Error("new figures are written more than once a minute")
	}
	w.written["default/c"] = time.Now().Add(-2 * statusRefresh)
	if !w.due(ch, routingStatus(ch, d), d) {
		t.Error("figures a minute old are not refreshed")
	}
	d.Route = []string{"hk", "seattle", "la"}
	w.written["default/c"] = time.Now()
	if !w.due(ch, routingStatus(ch, d), d) {
		t.Error("a new route waits for the refresh")
	}

	// A figure or a candidate the first write lacked is filled at once;
	// one that goes missing again waits for the refresh.
	d.Route = []string{"hk", "la"}
	d.Measured = 5 * time.Millisecond
	if !w.due(ch, routingStatus(ch, d), d) {
		t.Error("a measured latency the status lacks waits for the refresh")
	}
	ch.Status = *routingStatus(ch, d)
	d.Measured = 0
	if w.due(ch, routingStatus(ch, d), d) {
		t.Error("a measured latency that went missing is written before the refresh")
	}
	d.Measured = 5 * time.Millisecond
	d.Candidates = []route.Path{{Relays: []string{"hk", "la"}}, {Relays: []string{"hk", "seattle", "la"}}}
	if !w.due(ch, routingStatus(ch, d), d) {
		t.Error("a candidate the status lacks waits for the refresh")
	}
	ch.Status = *routingStatus(ch, d)
	d.Candidates = d.Candidates[:1]
	if w.due(ch, routingStatus(ch, d), d) {
		t.Error("a candidate that went missing is written before the refresh")
	}
}
