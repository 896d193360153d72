package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A Chain names the relays it lacks, then those not ready, and takes its
// route once every relay runs.
func TestChainConditions(t *testing.T) {
	needAPI(t)
	ctx := context.Background()
	ns := namespace(t)
	// Relay names are unique across namespaces (they are certificate
	// names), so this test has its own.
	ch := chain(ns, "east", "c-hk", "c-sea", "c-la")
	create(t, ch)
	cond := waitReason(t, ch, "RelayNotFound")
	if !strings.Contains(cond.Message, `"c-hk"`) {
		t.Errorf("message: %s", cond.Message)
	}

	relays := relayNodes(t, ns, 7400, "c-hk", "c-sea", "c-la")
	cond = waitReason(t, ch, "RelayNotReady")
	if !strings.Contains(cond.Message, `"c-hk", "c-sea", "c-la"`) {
		t.Errorf("RelayNotReady should name every relay that is not ready: %s", cond.Message)
	}
	for i, rn := range relays {
		runRelayPod(t, rn, fmt.Sprintf("192.0.2.%d", 10+i))
	}
	waitReason(t, ch, "RouteReady")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(ch), ch); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ch.Status.Route, ",") != "c-hk,c-sea,c-la" {
		t.Errorf("status.route %v", ch.Status.Route)
	}
}
