package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"
)

// handshake runs a real TLS handshake on loopback between a relay serving
// with server and one dialing peer with client, and returns each side's
// error.
func handshake(t *testing.T, server, client *Identity, peer string) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		sc := tls.Server(c, server.ServerConfig(nil))
		err = sc.Handshake()
		if err == nil {
			_, err = sc.Write([]byte{1}) // what the client reads once both ends took each other
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, client.ClientConfig(peer))
	clientErr = tc.Handshake()
	if clientErr == nil {
		// TLS 1.3: the server's check of the client's certificate ends
		// its handshake after the client's; a read sees its alert.
		var b [1]byte
		_, clientErr = tc.Read(b[:])
	}
	tc.Close()
	return <-done, clientErr
}

func clusterIdentity(t *testing.T, ca *CA, ns, name string, validity time.Duration) *Identity {
	t.Helper()
	c, k, err := ca.IssueIn(ns, name, validity)
	if err != nil {
		t.Fatal(err)
	}
	id, err := NewIdentity(name, ca.PEM, c, k)
	if err != nil {
		t.Fatal(err)
	}
	id.Namespace = ns
	return id
}

// A relay in a cluster takes as a peer only a certificate of its own
// namespace, whichever side dials: relay y of namespace a holds no
// certificate that namespace b's relays take as their y.
func TestPeersMustBeOfTheRelaysNamespace(t *testing.T) {
	ca, _ := NewCA("test")
	la := clusterIdentity(t, ca, "a", "la", ClusterRelayValidity)
	yOfA := clusterIdentity(t, ca, "a", "y", ClusterRelayValidity)
	yOfB := clusterIdentity(t, ca, "b", "y", ClusterRelayValidity)

	if s, c := handshake(t, la, yOfA, "la"); s != nil || c != nil {
		t.Fatalf("y of a refused by la of a: server %v, client %v", s, c)
	}
	if s, c := handshake(t, yOfA, la, "y"); s != nil || c != nil {
		t.Fatalf("la of a refused y of a: server %v, client %v", s, c)
	}
	// b's y dials a's la: la refuses it. (b's y would refuse la too; as
	// an attacker's relay, it checks nothing.)
	attacker := clusterIdentity(t, ca, "b", "y", ClusterRelayValidity)
	attacker.Namespace = ""
	if s, _ := handshake(t, la, attacker, "la"); s == nil || !strings.Contains(s.Error(), `relay "y" of namespace "b"; this relay's peers are those of namespace "a"`) {
		t.Fatalf("la of a accepted y of b as a client: %v", s)
	}
	// a's la dials y and b's y answers: la refuses it.
	if _, c := handshake(t, yOfB, la, "y"); c == nil || !strings.Contains(c.Error(), `namespace "b"`) {
		t.Fatalf("la of a accepted y of b as its server: %v", c)
	}
	// The operator's admin client is no relay of a namespace.
	op, err := ca.IssueOperator(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkNamespace("a", op.Leaf); err != nil {
		t.Fatalf("the operator's certificate refused: %v", err)
	}
}

// Certificates without a namespace: standalone relays take them; relays
// in a cluster take only those of a pod certificate's lifetime (an older
// operator's signer), not the year-long ones older operators wrote into
// Secrets.
func TestCertificatesWithoutNamespace(t *testing.T) {
	ca, _ := NewCA("test")
	standalone := func(name string) *Identity {
		id, err := ca.Identity(name)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	hk, la := standalone("hk"), standalone("la")
	if s, c := handshake(t, hk, la, "hk"); s != nil || c != nil {
		t.Fatalf("standalone relays refused each other: server %v, client %v", s, c)
	}
	// A standalone relay takes a namespaced certificate too (its name
	// must agree with the DNS name).
	nsLA := clusterIdentity(t, ca, "a", "la", ClusterRelayValidity)
	nsLA.Namespace = "" // it runs standalone
	if s, _ := handshake(t, hk, nsLA, "hk"); s != nil {
		t.Fatalf("standalone relay refused a namespaced certificate: %v", s)
	}

	inCluster := clusterIdentity(t, ca, "a", "y", ClusterRelayValidity)
	if s, _ := handshake(t, inCluster, la, "y"); s == nil || !strings.Contains(s.Error(), "names no namespace and is valid for 365.0 days") {
		t.Fatalf("a relay in a cluster accepted a year-long certificate without a namespace: %v", s)
	}
	// A day-long certificate without a namespace, as an older operator's
	// pod signer issued.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	certPEM, _, _, err := ca.IssueFor(key.Public(), "", "la", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := NewIdentity("la", ca.PEM, certPEM, pemBlock("PRIVATE KEY", der))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := handshake(t, inCluster, pod, "y"); s != nil {
		t.Fatalf("a relay in a cluster refused an older operator's pod certificate: %v", s)
	}
	// A SPIFFE ID that disagrees with the DNS name is refused everywhere.
	bad, _, _, err := ca.IssueFor(key.Public(), "a", "la", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := mustLeaf(t, bad)
	leaf.DNSNames = []string{"hk"}
	if err := checkNamespace("", leaf); err == nil {
		t.Fatal("a certificate whose SPIFFE ID names another relay was accepted")
	}
}
