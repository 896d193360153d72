package pki

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Identity is what a relay presents and trusts.
type Identity struct {
	Name string
	// Namespace, when set (a relay in a cluster), is the namespace its
	// peers' certificates must name (RelayURI): its peers are the
	// RelayNodes of its own namespace. Empty for standalone relays, whose
	// manifests name no namespace. Set it before the first handshake.
	Namespace string
	Cert      tls.Certificate // as loaded; handshakes use the latest Renew or Update

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
