// Package pki makes and loads the certificates relays use to authenticate
// each other. A relay's identity is its RelayNode name, carried as the
// certificate's only DNS name; a relay accepts a peer only if the peer's
// certificate chains to the CA it was given.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// ALPN is the application protocol relays speak over QUIC and TLS.
const ALPN = "hoplink/1"

// AdminALPN is the protocol of a relay's admin API: HTTP on the relay's TLS
// port, for the operator's route controller alone.
const AdminALPN = "hoplink-admin/1"

// OperatorName is the name in the operator's client certificate. Relay
// names are DNS labels, without dots, so no relay can hold it.
const OperatorName = "operator.hoplink.dev"

// ObserverName is the name in the certificate `hoplink status` and
// `hoplink probe` present to relays' admin API: it may read a relay's
// status and measure chains, nothing else, and is never a relay's.
const ObserverName = "observer.hoplink.dev"

// ObserverValidity is how long an observer certificate holds.
const ObserverValidity = 90 * 24 * time.Hour

// Observer files in a certificate directory.
const (
	ObserverCert = "observer.crt"
	ObserverKey  = "observer.key"
)

// AdminClient says whether name may call a relay's admin API.
func AdminClient(name string) bool { return name == OperatorName || name == ObserverName }

// Validity of generated certificates.
const (
	CAValidity    = 10 * 365 * 24 * time.Hour
	RelayValidity = 365 * 24 * time.Hour
)

// CA signs relay certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte // the certificate, PEM encoded
	// Trust, when set, is what relays trust instead of PEM alone: a bundle
	// of this CA and others (the old and the new during a rotation).
	Trust []byte
}

// TrustPEM is the CA certificates relays trust, this one among them.
func (ca *CA) TrustPEM() []byte {
	if len(ca.Trust) > 0 {
		return ca.Trust
	}
	return ca.PEM
}

// SetTrust makes relays trust bundle (PEM) as well as this CA; the CA is
// added to it when missing.
func (ca *CA) SetTrust(bundle []byte) error {
	pool, err := ParseRoots(bundle)
	if err != nil {
		return err
	}
	if _, err := ca.Cert.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		bundle = append(append(bytes.TrimRight(bundle, "\n"), '\n'), ca.PEM...)
	}
	ca.Trust = bundle
	return nil
}

// NewCA makes a self-signed ECDSA P-256 CA.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"hoplink"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der)}, nil
}

// IssueOperator makes the operator's client certificate, in memory: it
// reads the relays' admin API with it.
func (ca *CA) IssueOperator(validity time.Duration) (tls.Certificate, error) {
	return ca.issueClient(OperatorName, validity)
}

// IssueObserver makes an observer's client certificate in memory, as
// `hoplink status --kube` does from the cluster's CA.
func (ca *CA) IssueObserver(validity time.Duration) (tls.Certificate, error) {
	return ca.issueClient(ObserverName, validity)
}

func (ca *CA) issueClient(name string, validity time.Duration) (tls.Certificate, error) {
	certPEM, keyPEM, err := ca.issue(name, validity, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil {
		pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0])
	}
	return pair, err
}

// AdminClientConfig is the TLS config of the operator calling a relay's
// admin API: the relay must present a certificate from the CA for its name.
func AdminClientConfig(roots *x509.CertPool, cert func() (*tls.Certificate, error), relay string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		RootCAs:              roots,
		ServerName:           relay,
		NextProtos:           []string{AdminALPN},
	}
}

// Issue makes a certificate for the relay of that name, valid as both TLS
// server and client, since every relay is both.
func (ca *CA) Issue(relay string) (certPEM, keyPEM []byte, err error) {
	return ca.issue(relay, RelayValidity, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
}

// IssueFor makes a relay certificate for a key the CA never sees (a pod's
// key, from a PodCertificateRequest), valid for lifetime from a minute ago
// (clocks differ a little).
func (ca *CA) IssueFor(pub crypto.PublicKey, relay string, lifetime time.Duration) (certPEM []byte, notBefore, notAfter time.Time, err error) {
	notBefore = time.Now().Add(-time.Minute).Truncate(time.Second)
	notAfter = notBefore.Add(lifetime)
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: relay, Organization: []string{"hoplink"}},
		DNSNames:     []string{relay},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, time.Time{}, time.Time{}, err
	}
	return pemBlock("CERTIFICATE", der), notBefore, notAfter, nil
}

// IssueServer makes a TLS server certificate for hosts (DNS names, or IP
// addresses as IP SANs): the operator's webhook serving certificate.
func (ca *CA) IssueServer(hosts []string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("a server certificate needs at least one host")
	}
	return ca.issue(hosts[0], validity, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, hosts[1:]...)
}

func (ca *CA) issue(name string, validity time.Duration, usage []x509.ExtKeyUsage, more ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"hoplink"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	for _, h := range append([]string{name}, more...) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", kder), nil
}

// KeyPEM encodes the CA's private key.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// LoadCA reads a CA certificate and key written by WriteCA.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load CA: %w: make a CA with 'hoplink cert ca --certs %s', or give the directory that holds ca.crt and ca.key", err, filepath.Dir(certFile))
	}
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA %s, %s: %w", certFile, keyFile, err)
	}
	return ca, nil
}

// ParseCA builds a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA certificate")
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("the key cannot sign")
	}
	return &CA{Cert: cert, Key: signer, PEM: certPEM}, nil
}

// Identity is what a relay presents and trusts.
type Identity struct {
	Name string
	Cert tls.Certificate // as loaded; handshakes use the latest Renew or Update

	current atomic.Pointer[tls.Certificate]
	roots   atomic.Pointer[x509.CertPool]
}

// Roots are the CAs peers' certificates must chain to now: a bundle during
// a CA rotation (the old CA and the new).
func (id *Identity) Roots() *x509.CertPool { return id.roots.Load() }

// SetRoots replaces the CAs peers must chain to (tests, and Update).
func (id *Identity) SetRoots(p *x509.CertPool) { id.roots.Store(p) }

// Renew replaces the certificate that new handshakes present, after the same
// checks as NewIdentity against the same CA. Connections already up keep
// theirs. The operator renews relay certificates well before they expire.
func (id *Identity) Renew(certPEM, keyPEM []byte) error {
	pair, err := verifiedPair(id.Name, id.Roots(), certPEM, keyPEM)
	if err != nil {
		return err
	}
	id.current.Store(&pair)
	return nil
}

// Update replaces the trusted CAs and the certificate together, the
// certificate checked against the new CAs: how a CA rotation rolls through
// relays (first a bundle of the old and new CA with the old certificate,
// then certificates of the new CA, then the new CA alone) without a
// restart and without a moment in which two relays distrust each other.
// New handshakes use the new CAs; connections already up keep the trust
// they were made under, until they end or the certificate they were made
// with expires. Nothing changes when the new files fail a check.
func (id *Identity) Update(caPEM, certPEM, keyPEM []byte) error {
	roots, err := ParseRoots(caPEM)
	if err != nil {
		return err
	}
	pair, err := verifiedPair(id.Name, roots, certPEM, keyPEM)
	if err != nil {
		return err
	}
	id.roots.Store(roots)
	id.current.Store(&pair)
	return nil
}

// NotAfter is when the certificate new handshakes present expires.
func (id *Identity) NotAfter() time.Time { return id.Certificate().Leaf.NotAfter }

// ParseRoots is the pool of the CA certificates in caPEM.
func ParseRoots(caPEM []byte) (*x509.CertPool, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA file holds no PEM certificate")
	}
	return roots, nil
}

// Certificate is the certificate new handshakes present.
func (id *Identity) Certificate() *tls.Certificate {
	if c := id.current.Load(); c != nil {
		return c
	}
	return &id.Cert
}

// NewIdentity builds an Identity from PEM blocks and checks that the
// certificate names the relay and chains to the CA, so a mix-up of files
// fails at start and not at the first handshake.
func NewIdentity(name string, caPEM, certPEM, keyPEM []byte) (*Identity, error) {
	roots, err := ParseRoots(caPEM)
	if err != nil {
		return nil, err
	}
	pair, err := verifiedPair(name, roots, certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	id := &Identity{Name: name, Cert: pair}
	id.roots.Store(roots)
	return id, nil
}

func verifiedPair(name string, roots *x509.CertPool, certPEM, keyPEM []byte) (tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return pair, fmt.Errorf("relay certificate and key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return pair, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:     roots,
		DNSName:   name,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return pair, fmt.Errorf("certificate is not valid for relay %q under this CA: %w", name, err)
	}
	pair.Leaf = leaf
	return pair, nil
}

// LoadIdentity reads a relay's CA, certificate and key from PEM files.
// A missing file or a certificate out of its validity says which command
// makes or renews it, or that the clock is off.
func LoadIdentity(name, caFile, certFile, keyFile string) (*Identity, error) {
	var blobs [3][]byte
	for i, f := range []string{caFile, certFile, keyFile} {
		b, err := os.ReadFile(f)
		switch {
		case errors.Is(err, fs.ErrNotExist) && i == 0:
			return nil, fmt.Errorf("CA certificate: %w: copy into %s the ca.crt of the CA that issues the relays' certificates ('hoplink cert ca --certs DIR' makes a CA)", err, filepath.Dir(f))
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("relay certificate: %w: %s", err, issueHint(name, caFile, certFile, keyFile))
		case errors.Is(err, fs.ErrPermission):
			return nil, fmt.Errorf("%w: this relay runs as uid %d, which may not read it: make it readable to that user (chown, or a group of its and chmod 0640)", err, os.Getuid())
		case err != nil:
			return nil, err
		}
		blobs[i] = b
	}
	id, err := NewIdentity(name, blobs[0], blobs[1], blobs[2])
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w%s%s", certFile, keyFile, err, validityHint(blobs[1], name, time.Now()), mismatchHint(err, name, caFile, certFile))
	}
	return id, nil
}

// mismatchHint says which files do not belong together.
func mismatchHint(err error, name, caFile, certFile string) string {
	var authority x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &authority):
		return fmt.Sprintf("; %s was not issued by the CA of %s: issue it again from that CA ('hoplink cert issue'), or put in %s the CA that issued it", certFile, caFile, caFile)
	case errors.As(err, &host):
		return fmt.Sprintf("; %s is another relay's: give relay %q its own (--certs DIR reads DIR/%s.crt and DIR/%s.key)", certFile, name, name, name)
	case strings.Contains(err.Error(), "private key does not match public key"):
		return "; the key is not the certificate's: copy both from one 'hoplink cert issue'"
	}
	return ""
}

// issueHint says how to make a relay's missing certificate files: the
// exact command when the CA's key is beside its certificate and the
// files go where 'hoplink cert issue' writes them.
func issueHint(name, caFile, certFile, keyFile string) string {
	dir := filepath.Dir(caFile)
	_, err := os.Stat(filepath.Join(dir, "ca.key"))
	if err == nil && certFile == filepath.Join(dir, name+".crt") && keyFile == filepath.Join(dir, name+".key") {
		return fmt.Sprintf("issue them with 'hoplink cert issue --certs %s %s'", dir, name)
	}
	return fmt.Sprintf("issue them with 'hoplink cert issue --certs DIR %s' where the CA's key is (it writes DIR/%s.crt and DIR/%s.key), then copy both to %s and %s", name, name, name, certFile, keyFile)
}

// validityHint says why a certificate is not valid now, when that is why:
// expired (renew it), or not valid yet (this host's clock is behind).
func validityHint(certPEM []byte, name string, now time.Time) string {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return ""
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return ""
	}
	switch {
	case now.After(c.NotAfter):
		return fmt.Sprintf("; it expired on %s: renew it with 'hoplink cert renew --certs DIR %s' where the CA's key is (if it should still be valid, this host's clock is ahead: it says %s)",
			c.NotAfter.UTC().Format(time.RFC3339), name, now.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Sprintf("; it is valid from %s, and this host's clock says %s: set the clock right (NTP: timedatectl set-ntp true)",
			c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return ""
}

// Issue makes an in-memory Identity for a relay, as local mode does.
func (ca *CA) Identity(name string) (*Identity, error) {
	c, k, err := ca.Issue(name)
	if err != nil {
		return nil, err
	}
	return NewIdentity(name, ca.PEM, c, k)
}

// DeriveKey derives a 32-byte secret from the relay's private key, stable
// for as long as the key is. QUIC uses one to send stateless resets: a relay
// that restarted can then tell its peers at once that their old connection
// is gone, instead of letting them wait for an idle timeout.
func (id *Identity) DeriveKey(label string) ([32]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(id.Cert.PrivateKey)
	if err != nil {
		return [32]byte{}, err
	}
	mac := hmac.New(sha256.New, der)
	mac.Write([]byte("hoplink " + label))
	var k [32]byte
	copy(k[:], mac.Sum(nil))
	return k, nil
}

// ServerConfig is the TLS config of a relay's listener: it requires a client
// certificate from the CA, and offers the protocols given (ALPN when none).
// The check is done here rather than by crypto/tls so that a rejected peer
// can be counted and logged, with the address it came from, through
// onReject.
func (id *Identity) ServerConfig(onReject func(remote net.Addr, err error), protos ...string) *tls.Config {
	if len(protos) == 0 {
		protos = []string{ALPN}
	}
	base := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return id.Certificate(), nil },
		ClientAuth:     tls.RequireAnyClientCert,
		NextProtos:     protos,
	}
	conf := base.Clone()
	// Each handshake gets a config that knows its client's address (quic-go
	// fills in ClientHelloInfo.Conn too).
	conf.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		var remote net.Addr
		if hello.Conn != nil {
			remote = hello.Conn.RemoteAddr()
		}
		c := base.Clone()
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			err := id.verifyPeer(raw)
			if err != nil && onReject != nil {
				onReject(remote, err)
			}
			return err
		}
		return c, nil
	}
	return conf
}

func (id *Identity) verifyPeer(raw [][]byte) error {
	if len(raw) == 0 {
		return errors.New("peer presented no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, der := range raw {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         id.Roots(),
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return fmt.Errorf("peer certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	if len(certs[0].DNSNames) != 1 {
		return fmt.Errorf("peer certificate names %d relays, want 1", len(certs[0].DNSNames))
	}
	return nil
}

// ClientConfig is the TLS config for dialing the named peer: the peer must
// present a certificate from the CA for exactly that name.
func (id *Identity) ClientConfig(peer string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.Certificate(), nil },
		RootCAs:              id.Roots(),
		ServerName:           peer,
		NextProtos:           []string{ALPN},
	}
}

// PeerName returns the relay name of a peer whose certificate was verified
// during the handshake (by ClientConfig's or ServerConfig's checks).
func PeerName(state tls.ConnectionState) (string, error) {
	if len(state.PeerCertificates) == 0 {
		return "", errors.New("peer presented no certificate")
	}
	leaf := state.PeerCertificates[0]
	if len(leaf.DNSNames) != 1 {
		return "", fmt.Errorf("peer certificate names %d relays, want 1", len(leaf.DNSNames))
	}
	return leaf.DNSNames[0], nil
}

// WriteCA writes ca.crt and ca.key into dir, refusing to overwrite.
func (ca *CA) WriteCA(dir string) error {
	key, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{"ca.crt": ca.PEM, "ca.key": key})
}

// WriteRelay issues and writes NAME.crt and NAME.key into dir.
func (ca *CA) WriteRelay(dir, name string) error {
	c, k, err := ca.Issue(name)
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{name + ".crt": c, name + ".key": k})
}

// WriteObserver issues and writes the observer's client certificate
// (ObserverCert, ObserverKey) into dir.
func (ca *CA) WriteObserver(dir string) error {
	c, k, err := ca.issue(ObserverName, ObserverValidity, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{ObserverCert: c, ObserverKey: k})
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("%s exists; remove it first or choose another directory", filepath.Join(dir, name))
		}
	}
	for name, data := range files {
		mode := os.FileMode(0o644)
		if filepath.Ext(name) == ".key" {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, mode); err != nil {
			return err
		}
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
