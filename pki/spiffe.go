package pki

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// TrustDomain is the trust domain of relay identities. It is the same in
// every cluster: what separates clusters is the CA a relay trusts, not
// this string, so a cluster that trusts another's CA (multi-cluster) takes
// that cluster's relays of the same namespace as its own, as the
// multi-cluster setup asks (one namespace of the same name in each).
const TrustDomain = "hoplink"

// RelayURI is the SPIFFE-style identity an operator-issued relay
// certificate carries as its only URI SAN, beside its name as its DNS
// name: spiffe://hoplink/ns/NAMESPACE/relay/NAME. Relay names are unique
// across an operator's namespaces, but a name freed in one namespace may
// be taken in another; the namespace keeps a certificate from being taken
// there for the new holder.
func RelayURI(namespace, relay string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/ns/" + namespace + "/relay/" + relay}
}

// RelayOf reads the relay identity of a certificate's URI SANs: its
// namespace and name, and whether it has one. More than one, or one that
// is not of this form, is an error.
func RelayOf(c *x509.Certificate) (namespace, relay string, ok bool, err error) {
	for _, u := range c.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if ok {
			return "", "", false, fmt.Errorf("certificate carries more than one SPIFFE ID")
		}
		parts := strings.Split(u.Path, "/")
		if u.Host != TrustDomain || len(parts) != 5 || parts[0] != "" || parts[1] != "ns" || parts[3] != "relay" ||
			parts[2] == "" || parts[4] == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return "", "", false, fmt.Errorf("certificate's SPIFFE ID %q is not spiffe://%s/ns/NAMESPACE/relay/NAME", u, TrustDomain)
		}
		namespace, relay, ok = parts[2], parts[4], true
	}
	return namespace, relay, ok, nil
}

// LegacyPodCertLifetime is the longest lifetime of a relay certificate
// without a namespace that a relay in a cluster still accepts: the pod
// certificates an operator older than namespaced identities issued (a day,
// from its signer, which checked the pod's namespace against the API
// server when it signed). The kubelet replaces them within 16 hours. The
// year-long certificates such operators wrote into Secrets, which outlive
// the RelayNode they were issued for, are refused.
const LegacyPodCertLifetime = 24*time.Hour + 2*time.Minute

// checkNamespace says whether a relay of namespace ns (empty: a
// standalone relay, whose manifests name no namespace) takes leaf as one
// of its peers. Leaf's chain and usage were checked already.
func checkNamespace(ns string, leaf *x509.Certificate) error {
	if len(leaf.DNSNames) != 1 {
		return fmt.Errorf("peer certificate names %d relays, want 1", len(leaf.DNSNames))
	}
	name := leaf.DNSNames[0]
	if AdminClient(name) {
		return nil // the operator and observers are no relays of a namespace
	}
	peerNS, relay, ok, err := RelayOf(leaf)
	switch {
	case err != nil:
		return err
	case ok && relay != name:
		return fmt.Errorf("peer certificate names relay %q in its SPIFFE ID and %q as its DNS name", relay, name)
	case ok && ns != "" && peerNS != ns:
		return fmt.Errorf("peer certificate is relay %q of namespace %q; this relay's peers are those of namespace %q", name, peerNS, ns)
	case ok || ns == "":
		return nil
	case leaf.NotAfter.Sub(leaf.NotBefore) <= LegacyPodCertLifetime:
		return nil
	}
	return fmt.Errorf("peer certificate for relay %q names no namespace and is valid for %.1f days: in a cluster, relays take only certificates of their namespace (spiffe://%s/ns/%s/relay/%s), which the operator issues, or pod certificates of a day",
		name, leaf.NotAfter.Sub(leaf.NotBefore).Hours()/24, TrustDomain, ns, name)
}
