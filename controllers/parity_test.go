package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/manifest"
)

// parityRelays are valid RelayNodes the cases refer to, so that local mode
// judges each case's own object and not a missing reference.
const parityRelays = `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {port: 17401}, endpoints: ["127.0.0.1:17401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 17402}, endpoints: ["127.0.0.1:17402"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
`

// TestLocalValidationMatchesCRDs sends each bad manifest to the real API
// server (with kubectl's strict field validation) and through local mode's
// loader: both must refuse it, and both must name the same field, so a
// manifest that runs locally is one the cluster takes and the other way
// round.
func TestLocalValidationMatchesCRDs(t *testing.T) {
	needAPI(t)
	ns := namespace(t)
	cases := []struct{ name, doc, field string }{
		{"route off the entry", "kind: Chain\nmetadata: {name: x}\nspec: {entry: hk, exit: la, route: [la]}", "spec.route"},
		{"unknown mode", "kind: Chain\nmetadata: {name: x}\nspec: {entry: hk, exit: la, mode: fastest}", "spec.mode"},
		{"relay name not a label", "kind: Chain\nmetadata: {name: x}\nspec: {entry: HK, exit: la, route: [HK, la]}", "spec.entry"},
		{"probe interval not a duration", "kind: Chain\nmetadata: {name: x}\nspec: {entry: hk, exit: la, mode: sum, probe: {interval: 5x}}", "spec.probe.interval"},
		{"unknown field", "kind: Chain\nmetadata: {name: x}\nspec: {entry: hk, exyt: la, route: [hk, la]}", "spec.exyt"},
		{"port out of range", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 70000}, target: \"10.0.0.1:80\"}", "spec.listen.port"},
		{"target without a port", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1\"}", "spec.target"},
		{"udp options on tcp", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", udp: {maxSessions: 10}}", "spec.udp"},
		{"proxy v1 on udp", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: udp, listen: {port: 8080}, target: \"10.0.0.1:53\", proxyProtocol: v1}", "spec.proxyProtocol"},
		{"proxy version unknown", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", proxyProtocol: v3}", "spec.proxyProtocol"},
		{"allowed source not a CIDR", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080, allowedSources: [10.0.0.0/8, 10.1.2.3]}, target: \"10.0.0.1:80\"}", "spec.listen.allowedSources"},
		{"rate limit negative", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", limits: {rateMbps: -5}}", "spec.limits.rateMbps"},
		{"rate limit past 100 Gbit/s", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", limits: {rateMbps: 200000}}", "spec.limits.rateMbps"},
		{"max flows zero or less", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", limits: {maxFlows: -1}}", "spec.limits.maxFlows"},
		{"weight past 100", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, listen: {port: 8080}, target: \"10.0.0.1:80\", limits: {weight: 101}}", "spec.limits.weight"},
		{"limits on tun", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun, tun: {address: 10.200.0.1/24, routes: [10.77.0.0/16]}, limits: {rateMbps: 10}}", "spec.limits"},
		{"tun without a device", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun}", "spec.tun"},
		{"tun IPv6 below 1280", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun, tun: {address: \"fd20::1/64\", mtu: 1200, routes: [\"fd77::/64\"]}}", "spec.tun.mtu"},
		{"tun IPv6 address without prefix", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun, tun: {address: \"fd20::1\", routes: [\"fd77::/64\"]}}", "spec.tun.address"},
		{"tun IPv4-mapped route", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun, tun: {address: 10.200.0.1/24, routes: [\"::ffff:10.77.0.0/112\"]}}", "spec.tun.routes"},
		{"tun IPv6 source not a prefix", "kind: Tunnel\nmetadata: {name: x}\nspec: {chain: c, protocol: tun, tun: {address: \"fd20::1/64\", routes: [\"fd77::/64\"], mode: packet, sources: [\"fd30::/129\"]}}", "spec.tun.sources"},
		{"relay port zero", "kind: RelayNode\nmetadata: {name: x}\nspec: {listen: {port: 0}}", "spec.listen.port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := "apiVersion: hoplink.dev/v1alpha1\n" + tc.doc + "\n"
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatal(err)
			}
			u.SetNamespace(ns)
			apiErr := k8s.Create(context.Background(), &u, client.FieldValidation("Strict"))
			if apiErr == nil {
				k8s.Delete(context.Background(), &u)
			}
			_, localErr := manifest.Parse("case.yaml", []byte(parityRelays+"---\n"+doc))
			for who, err := range map[string]error{"the API server": apiErr, "local mode": localErr} {
				if err == nil {
					t.Errorf("%s accepted it", who)
				} else if !strings.Contains(err.Error(), tc.field) {
					t.Errorf("%s does not name %s: %v", who, tc.field, err)
				}
			}
			if t.Failed() {
				fmt.Printf("API: %v\nlocal: %v\n", apiErr, localErr)
			}
		})
	}
}
