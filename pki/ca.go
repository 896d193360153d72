package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Validity of generated certificates.
const (
	CAValidity = 10 * 365 * 24 * time.Hour
	// RelayValidity is that of certificates `hoplink cert` makes for
	// standalone relays, renewed by hand or from a timer.
	RelayValidity = 365 * 24 * time.Hour
	// ClusterRelayValidity is that of the certificates the operator
	// writes into relays' Secrets: it renews them a third before expiry,
	// and relays apply them without a restart, so a copied key is good
	// for days, not a year.
	ClusterRelayValidity = 7 * 24 * time.Hour
	// Backdate is how long before its issue a certificate is valid from,
	// whether issued anew or renewed for the key it had: hosts' clocks
	// differ, and a peer whose clock is behind the CA's refuses a
	// certificate that is not yet valid by its own.
	Backdate = time.Hour
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
		NotBefore:             time.Now().Add(-Backdate),
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
	certPEM, keyPEM, err := ca.issue(name, validity, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil {
		pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0])
	}
	return pair, err
}

// Issue makes a certificate for the standalone relay of that name, valid
// as both TLS server and client, since every relay is both. It names no
// namespace.
func (ca *CA) Issue(relay string) (certPEM, keyPEM []byte, err error) {
	return ca.issue(relay, RelayValidity, relayUsage, nil)
}

// IssueIn makes a certificate for the relay of that name in namespace, as
// the operator does: it carries RelayURI(namespace, relay) too.
func (ca *CA) IssueIn(namespace, relay string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	return ca.issue(relay, validity, relayUsage, []*url.URL{RelayURI(namespace, relay)})
}

var relayUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// IssueFor makes a relay certificate for a key the CA never sees (a pod's
// key, from a PodCertificateRequest), valid for lifetime from a minute ago
// (clocks differ a little). A namespace, when given, is carried as
// RelayURI(namespace, relay).
func (ca *CA) IssueFor(pub crypto.PublicKey, namespace, relay string, lifetime time.Duration) (certPEM []byte, notBefore, notAfter time.Time, err error) {
	notBefore = time.Now().Add(-time.Minute).Truncate(time.Second)
	notAfter = notBefore.Add(lifetime)
	var uris []*url.URL
	if namespace != "" {
		uris = []*url.URL{RelayURI(namespace, relay)}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: relay, Organization: []string{"hoplink"}},
		DNSNames:     []string{relay},
		URIs:         uris,
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
	return ca.issue(hosts[0], validity, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, nil, hosts[1:]...)
}

func (ca *CA) issue(name string, validity time.Duration, usage []x509.ExtKeyUsage, uris []*url.URL, more ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if certPEM, err = ca.sign(key.Public(), name, validity, usage, uris, more...); err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, pemBlock("PRIVATE KEY", kder), nil
}

// Reissue makes the certificate of the standalone relay of that name again
// for the key it holds, valid as long as Issue makes one: 'cert renew'
// keeps relays' keys.
func (ca *CA) Reissue(pub crypto.PublicKey, relay string) (certPEM []byte, err error) {
	return ca.sign(pub, relay, RelayValidity, relayUsage, nil)
}

// sign makes a certificate for pub, valid from Backdate ago for validity
// from now.
func (ca *CA) sign(pub crypto.PublicKey, name string, validity time.Duration, usage []x509.ExtKeyUsage, uris []*url.URL, more ...string) ([]byte, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"hoplink"}},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		URIs:         uris,
	}
	for _, h := range append([]string{name}, more...) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return pemBlock("CERTIFICATE", der), nil
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

// Issue makes an in-memory Identity for a relay, as local mode does.
func (ca *CA) Identity(name string) (*Identity, error) {
	c, k, err := ca.Issue(name)
	if err != nil {
		return nil, err
	}
	return NewIdentity(name, ca.PEM, c, k)
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
