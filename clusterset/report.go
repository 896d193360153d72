// Package clusterset is the Multi-Cluster Services API (KEP 1645,
// multicluster.x-k8s.io) as hoplink carries it between clusters. Each
// cluster's operator tells the others what it exports in a Report, which its
// relays serve over their mutually authenticated admin API; every cluster
// merges the same Reports into the same services (Merge: the oldest export
// wins a conflict) and makes of them its ServiceImports, the Services behind
// their clusterset IPs and their EndpointSlices (imports.go), and the Chains
// and Tunnels that carry their traffic through the relays (plan.go).
//
// Everything here is pure: no I/O and no clock, so every cluster that holds
// the same Reports builds the same objects, and the tests need no cluster.
package clusterset

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Report is what one cluster tells the other clusters of its clusterset.
type Report struct {
	// Cluster is the cluster's ID: its ClusterProperty
	// cluster.clusterset.k8s.io, else the operator's --cluster-id. A DNS
	// label, since it names DNS records (HOST.CLUSTER.SVC.NS.svc.clusterset.local).
	Cluster string `json:"cluster"`
	// ClusterSet is the clusterset's name (ClusterProperty clusterset.k8s.io);
	// clusters of another set are not merged.
	ClusterSet string `json:"clusterSet,omitempty"`
	// Generation counts the cluster's reports: a reader keeps the highest.
	Generation int64 `json:"generation"`
	// Gateway is the RelayNode at which this cluster's calls to imported
	// services enter the relays, and other clusters' calls leave them.
	Gateway string `json:"gateway"`
	// Local are this cluster's own relays in the relay namespace; Known
	// every RelayNode it knows there (its own and other clusters' relays,
	// written as external), sorted. Chains may pass through the relays
	// that every cluster knows.
	Local []string `json:"local"`
	Known []string `json:"known"`
	// Mode is how the Chains that enter at this cluster's gateway route
	// (sum or pipe).
	Mode string `json:"mode,omitempty"`
	// Exports are the cluster's valid ServiceExports.
	Exports []Export `json:"exports,omitempty"`
	// Entries are the listen ports this cluster gave the Tunnels that enter
	// at its gateway; the other clusters copy them.
	Entries []Entry `json:"entries,omitempty"`
	// Seen is, for each other cluster, the highest Entry.Seq of that
	// cluster's this one has copied: a Tunnel is used only once the exporting
	// cluster holds it, or its exit would refuse the flows.
	Seen map[string]int64 `json:"seen,omitempty"`
	// Missing are the services (namespace/name) this cluster cannot import
	// because it has no namespace of that name.
	Missing []string `json:"missing,omitempty"`
}

// Export is one exported Service as its cluster sees it.
type Export struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Created is the ServiceExport's creation: the oldest export's
	// properties win a conflict.
	Created               metav1.Time                          `json:"created"`
	Type                  mcsv1beta1.ServiceImportType         `json:"type"`
	Ports                 []mcsv1beta1.ServicePort             `json:"ports,omitempty"`
	SessionAffinity       corev1.ServiceAffinity               `json:"sessionAffinity,omitempty"`
	SessionAffinityConfig *corev1.SessionAffinityConfig        `json:"sessionAffinityConfig,omitempty"`
	IPFamilies            []corev1.IPFamily                    `json:"ipFamilies,omitempty"`
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`
	TrafficDistribution   *string                              `json:"trafficDistribution,omitempty"`
	Labels                map[string]string                    `json:"labels,omitempty"`
	Annotations           map[string]string                    `json:"annotations,omitempty"`
	// Address is the Service's cluster IP, which the gateway dials for the
	// other clusters (ClusterSetIP).
	Address string `json:"address,omitempty"`
	// Endpoints are the addresses behind a headless Service, per address
	// type, with their host names and readiness: what DNS answers for it in
	// every cluster.
	Endpoints []Endpoints `json:"endpoints,omitempty"`
}

// Key is the namespace/name of the service.
func (e *Export) Key() string { return e.Namespace + "/" + e.Name }

// Endpoints are the endpoints of one address type behind a headless Service.
type Endpoints struct {
	AddressType discoveryv1.AddressType    `json:"addressType"`
	Ports       []discoveryv1.EndpointPort `json:"ports,omitempty"`
	Endpoints   []Endpoint                 `json:"endpoints"`
}

// Endpoint is one backend: its addresses, host name (a StatefulSet's pods
// have one) and readiness.
type Endpoint struct {
	Addresses []string `json:"addresses"`
	Hostname  string   `json:"hostname,omitempty"`
	Ready     bool     `json:"ready"`
}

// Entry is the listen port a cluster gave a Tunnel entering at its gateway,
// and when (Seq, counting up in that cluster).
type Entry struct {
	Tunnel string `json:"tunnel"`
	Port   int32  `json:"port"`
	Seq    int64  `json:"seq"`
}

// Limits of a Report, so that a cluster (or a relay speaking for one) cannot
// make another hold more than this.
const (
	// MaxEncoded bounds a Report as stored and served (gzip): a ConfigMap
	// holds at most 1 MiB.
	MaxEncoded = 900 << 10
	// MaxDecoded bounds it once inflated.
	MaxDecoded = 64 << 20
	// MaxExports bounds the exports of one cluster.
	MaxExports = 20000
	// MaxEndpoints bounds the endpoints of one headless export, as an
	// EndpointSlice does.
	MaxEndpoints = 1000
	// MaxRelays bounds the relays a Report names.
	MaxRelays = 1000
)

// Encode is the Report as stored in the relay namespace's ConfigMap and
// served by relays: JSON, gzipped, at most MaxEncoded bytes.
func Encode(r *Report) ([]byte, error) {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	if err := json.NewEncoder(z).Encode(r); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	if b.Len() > MaxEncoded {
		return nil, fmt.Errorf("the clusterset report of cluster %q is %d bytes gzipped, more than the %d a ConfigMap can hold: export fewer services from it", r.Cluster, b.Len(), MaxEncoded)
	}
	return b.Bytes(), nil
}

// Decode reads what Encode wrote and checks it (Check).
func Decode(b []byte) (*Report, error) {
	if len(b) > MaxEncoded {
		return nil, fmt.Errorf("report of %d bytes, more than %d", len(b), MaxEncoded)
	}
	z, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(z, MaxDecoded+1))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if len(raw) > MaxDecoded {
		return nil, fmt.Errorf("report inflates to more than %d bytes", MaxDecoded)
	}
	var r Report
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if d.More() {
		return nil, errors.New("report: data after the report")
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Check says what is wrong with a Report, field by field: names that could
// not name the objects built from them, sizes past the limits.
func (r *Report) Check() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("report of cluster %q: %s: %s", r.Cluster, field, fmt.Sprintf(format, args...)))
	}
	if msgs := validation.IsDNS1123Label(r.Cluster); len(msgs) > 0 {
		bad("cluster", "%s", strings.Join(msgs, "; "))
	}
	if r.Generation < 0 {
		bad("generation", "%d is negative", r.Generation)
	}
	if r.ClusterSet != "" && len(validation.IsDNS1123Subdomain(r.ClusterSet)) > 0 {
		bad("clusterSet", "%q is not a DNS subdomain", r.ClusterSet)
	}
	if len(r.Local) > MaxRelays || len(r.Known) > MaxRelays {
		bad("known", "more than %d relays", MaxRelays)
	}
	for _, l := range [][]string{r.Local, r.Known} {
		for _, n := range l {
			if len(validation.IsDNS1123Label(n)) > 0 {
				bad("known", "%q is not a relay name", n)
			}
		}
	}
	if !slices.Contains(r.Local, r.Gateway) {
		bad("gateway", "%q is not one of the cluster's own relays %v", r.Gateway, r.Local)
	}
	for _, n := range r.Local {
		if !slices.Contains(r.Known, n) {
			bad("local", "%q is not among the known relays", n)
		}
	}
	switch r.Mode {
	case "", "sum", "pipe":
	default:
		bad("mode", "%q is not sum or pipe", r.Mode)
	}
	if len(r.Exports) > MaxExports {
		bad("exports", "%d exports, more than %d", len(r.Exports), MaxExports)
	}
	seen := map[string]bool{}
	for i := range r.Exports {
		e := &r.Exports[i]
		if seen[e.Key()] {
			bad(fmt.Sprintf("exports[%d]", i), "%s exported twice", e.Key())
		}
		seen[e.Key()] = true
		if err := e.Check(); err != nil {
			bad(fmt.Sprintf("exports[%d]", i), "%v", err)
		}
	}
	if len(r.Entries) > 4*MaxExports {
		bad("entries", "%d entries, more than %d", len(r.Entries), 4*MaxExports)
	}
	for i, en := range r.Entries {
		if len(validation.IsDNS1123Label(en.Tunnel)) > 0 || en.Port < 1 || en.Port > 65535 || en.Seq < 1 {
			bad(fmt.Sprintf("entries[%d]", i), "Tunnel %q port %d seq %d", en.Tunnel, en.Port, en.Seq)
		}
	}
	for c := range r.Seen {
		if len(validation.IsDNS1123Label(c)) > 0 {
			bad("seen", "%q is not a cluster ID", c)
		}
	}
	if len(r.Seen) > MaxRelays || len(r.Missing) > MaxExports {
		bad("seen", "too long")
	}
	return errors.Join(errs...)
}

// Check says what in an export could not be carried in a Report.
func (e *Export) Check() error {
	if len(validation.IsDNS1123Label(e.Namespace)) > 0 || len(validation.IsDNS1035Label(e.Name)) > 0 {
		return fmt.Errorf("%q is not a Service's namespace/name", e.Key())
	}
	switch e.Type {
	case mcsv1beta1.ClusterSetIP:
		if _, err := netip.ParseAddr(e.Address); err != nil {
			return fmt.Errorf("%s: address %q: %v", e.Key(), e.Address, err)
		}
	case mcsv1beta1.Headless:
	default:
		return fmt.Errorf("%s: type %q is neither ClusterSetIP nor Headless", e.Key(), e.Type)
	}
	if len(e.Ports) > 100 {
		return fmt.Errorf("%s: %d ports", e.Key(), len(e.Ports))
	}
	for _, p := range e.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("%s: port %d", e.Key(), p.Port)
		}
		switch p.Protocol {
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			return fmt.Errorf("%s: protocol %q", e.Key(), p.Protocol)
		}
		if p.Name != "" && len(validation.IsDNS1123Label(p.Name)) > 0 {
			return fmt.Errorf("%s: port name %q", e.Key(), p.Name)
		}
	}
	n := 0
	for _, s := range e.Endpoints {
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
		default:
			return fmt.Errorf("%s: address type %q", e.Key(), s.AddressType)
		}
		n += len(s.Endpoints)
		for _, ep := range s.Endpoints {
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || ip.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) {
					return fmt.Errorf("%s: endpoint address %q is not %s", e.Key(), a, s.AddressType)
				}
			}
			if ep.Hostname != "" && len(validation.IsDNS1123Label(ep.Hostname)) > 0 {
				return fmt.Errorf("%s: endpoint host name %q", e.Key(), ep.Hostname)
			}
		}
	}
	if n > MaxEndpoints {
		return fmt.Errorf("%s: %d endpoints, more than %d", e.Key(), n, MaxEndpoints)
	}
	for k, v := range e.Labels {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return fmt.Errorf("%s: exported label %q=%q", e.Key(), k, v)
		}
	}
	for k := range e.Annotations {
		if len(validation.IsQualifiedName(k)) > 0 {
			return fmt.Errorf("%s: exported annotation %q", e.Key(), k)
		}
	}
	return nil
}
