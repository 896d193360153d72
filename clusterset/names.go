package clusterset

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Labels and values of what the clusterset makes.
const (
	// LabelManaged marks every object made for the clusterset: imports,
	// their Services and EndpointSlices, and the relays' Chains and Tunnels.
	LabelManaged = "mcs.hoplink.dev/managed"
	// LabelEntry and LabelSource are a Tunnel's clusters: where its
	// flows enter the relays and whose Service they reach.
	LabelEntry  = "mcs.hoplink.dev/entry-cluster"
	LabelSource = "mcs.hoplink.dev/source-cluster"
	// AnnotationService and AnnotationPort say which service port a Tunnel
	// carries (namespace/name, protocol/port).
	AnnotationService = "mcs.hoplink.dev/service"
	AnnotationPort    = "mcs.hoplink.dev/port"
	// EndpointSliceManager is the endpointslice.kubernetes.io/managed-by of
	// the EndpointSlices of imports: not the Kubernetes controller's.
	EndpointSliceManager = "mcs.hoplink.dev"
)

// hash is a short, stable digest of parts.
func hash(n int, parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:])[:n]
}

// within cuts s to n characters, ending on a letter or digit.
func within(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.TrimRight(s, "-")
}

// DerivedName names the Service that holds an import's clusterset IPs, in
// the import's namespace: the name, a tag and a digest of the name, so no
// Service of a user's is taken and any Service name fits in 63 characters.
func DerivedName(name string) string {
	return within(name, 48) + "-mcs-" + hash(8, name)
}

// ChainName names the Chain from cluster entry's gateway to cluster
// source's, in the relay namespace.
func ChainName(entry, source string) string {
	return "mcs-" + within(entry+"-"+source, 50) + "-" + hash(8, entry, source)
}

// TunnelName names the Tunnel that carries one port of a service from
// cluster entry to cluster source.
func TunnelName(entry, source, namespace, name string, proto corev1.Protocol, port int32) string {
	return "mcs-" + hash(20, entry, source, namespace, name, string(proto), strconv.Itoa(int(port)))
}
