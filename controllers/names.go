// Package controllers reconciles hoplink's CRDs: a RelayNode becomes a relay
// DaemonSet with its certificate, ServiceAccount and RBAC; a Chain is checked
// against the RelayNodes it names; a Tunnel gets a Service in front of its
// entry relays. One reconciler per kind, as kubebuilder lays them out.
package controllers

import (
	"strconv"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

const (
	managerName    = "hoplink-operator"
	labelManagedBy = "app.kubernetes.io/managed-by"
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	// LabelRelayNode marks the pods (and the objects) of one RelayNode; a
	// Tunnel's Service selects its entry relay's pods by it.
	LabelRelayNode = "hoplink.dev/relaynode"

	conditionReady = "Ready"
)

// RelayObjectName names what the operator makes for a RelayNode: its
// DaemonSet, ServiceAccount, Role, RoleBinding and certificate Secret.
func RelayObjectName(relay string) string { return v1alpha1.RelayObjectName(relay) }

func relayLabels(relay string) map[string]string {
	return map[string]string{
		labelName:      "hoplink",
		labelComponent: "relay",
		labelManagedBy: managerName,
		LabelRelayNode: relay,
	}
}

// MetricsPort is where a relay serves /metrics, /healthz and /readyz: the
// relay port plus one, so relays that share a node's network do not collide.
func MetricsPort(rn *v1alpha1.RelayNode) int32 {
	if p := rn.Spec.Listen.Port; p > 0 && p < 65535 {
		return p + 1
	}
	return v1alpha1.DefaultRelayPort + 1
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
