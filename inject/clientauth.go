package inject

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// ClientAuth makes the webhook server take only callers with a client
// certificate that a CA of CAFile signed for client authentication: the
// API server presents one when its admission configuration
// (WebhookAdmissionConfiguration's kubeConfigFile) names one for the
// webhook. With Names, the certificate's common name or one of its DNS
// names must be among them: a cluster CA signs the kubelets' client
// certificates too.
//
// CAFile is read again when it changes (a mounted ConfigMap that the
// kubelet updates), looked at no more than once every reloadEvery.
type ClientAuth struct {
	CAFile string
	Names  []string

	mu      sync.Mutex
	pool    *x509.CertPool
	pem     []byte
	checked time.Time
}

// reloadEvery is how often a handshake may look at CAFile again.
const reloadEvery = 30 * time.Second

// NewClientAuth reads caFile once, so that a missing or unreadable file
// stops the operator at its start rather than refusing every caller.
func NewClientAuth(caFile string, names []string) (*ClientAuth, error) {
	a := &ClientAuth{CAFile: caFile, Names: slices.Clone(names)}
	if _, err := a.roots(time.Now()); err != nil {
		return nil, err
	}
	return a, nil
}

// Apply makes c ask every caller for a certificate and check it here, so
// that a new CA in the file needs no restart.
func (a *ClientAuth) Apply(c *tls.Config) {
	c.ClientAuth = tls.RequireAnyClientCert
	c.VerifyPeerCertificate = a.verify
}

func (a *ClientAuth) roots(now time.Time) (*x509.CertPool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pool != nil && now.Sub(a.checked) < reloadEvery {
		return a.pool, nil
	}
	a.checked = now
	b, err := os.ReadFile(a.CAFile)
	if err != nil {
		if a.pool != nil {
			return a.pool, nil // a ConfigMap volume between two versions: keep the last
		}
		return nil, fmt.Errorf("webhook client CA: %w", err)
	}
	if a.pool != nil && bytes.Equal(b, a.pem) {
		return a.pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		if a.pool != nil {
			return a.pool, nil
		}
		return nil, fmt.Errorf("webhook client CA: %s holds no PEM certificate", a.CAFile)
	}
	a.pool, a.pem = pool, b
	return pool, nil
}

// verify is tls.Config.VerifyPeerCertificate.
func (a *ClientAuth) verify(raw [][]byte, _ [][]*x509.Certificate) error {
	if len(raw) == 0 {
		return errors.New("the webhook takes only callers with a client certificate")
	}
	roots, err := a.roots(time.Now())
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, r := range raw[1:] {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return err
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("webhook client certificate: %w", err)
	}
	if len(a.Names) == 0 || slices.Contains(a.Names, leaf.Subject.CommonName) ||
		slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(a.Names, n) }) {
		return nil
	}
	return fmt.Errorf("webhook client certificate for %q: not one of the callers allowed (%v)", leaf.Subject.CommonName, a.Names)
}
