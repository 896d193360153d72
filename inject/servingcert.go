package inject

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/pki"
)

// Keys of the serving certificate's Secret: its own CA, and the leaf.
const (
	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
	keyCert   = corev1.TLSCertKey
	keyKey    = corev1.TLSPrivateKeyKey
)

// ServingCert makes and rotates the webhook's serving certificate without
// cert-manager: a CA of its own and a leaf for the webhook Service, kept in
// one Secret that every operator replica reads (so replicas serve the same
// certificate and agree on the CA), and the CA written into the webhook
// configuration's caBundle.
type ServingCert struct {
	Client client.Client
	Secret types.NamespacedName
	// Hosts the certificate names: the Service's DNS names (and, in tests,
	// an address).
	Hosts []string
	// WebhookConfig is the MutatingWebhookConfiguration whose caBundle this
	// keeps current; empty: none.
	WebhookConfig string
	// Validity of the leaf (default 90 days); renewed with a third left.
	Validity time.Duration
	// Every is how often the Secret and the caBundle are checked (default a minute).
	Every time.Duration
	Log   *slog.Logger

	cert atomic.Pointer[tls.Certificate]
}

// GetCertificate serves the current leaf (for tls.Config).
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cert.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("webhook serving certificate not loaded yet")
}

// Loaded reports whether a certificate is there to serve.
func (s *ServingCert) Loaded() bool { return s.cert.Load() != nil }

// NeedLeaderElection is false: every replica serves the webhook.
func (s *ServingCert) NeedLeaderElection() bool { return false }

// Start keeps the certificate and caBundle current until ctx ends.
func (s *ServingCert) Start(ctx context.Context) error {
	every := s.Every
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.Ensure(ctx); err != nil {
			s.log().Warn("webhook serving certificate", "err", err)
		}
	}
}

func (s *ServingCert) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *ServingCert) validity() time.Duration {
	if s.Validity <= 0 {
		return 90 * 24 * time.Hour
	}
	return s.Validity
}

// Ensure loads the Secret (making or renewing what it lacks), serves its
// leaf and publishes its CA in the caBundle.
func (s *ServingCert) Ensure(ctx context.Context) error {
	var sec corev1.Secret
	err := s.Client.Get(ctx, s.Secret, &sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Secret.Name, Namespace: s.Secret.Namespace,
			Labels: map[string]string{labelManagedBy: ManagedByOperator}}}
	case err != nil:
		return fmt.Errorf("read Secret %s: %w", s.Secret, err)
	}
	data, changed, err := s.complete(sec.Data)
	if err != nil {
		return err
	}
	if changed {
		sec.Data = data
		if sec.ResourceVersion == "" {
			err = s.Client.Create(ctx, &sec)
		} else {
			err = s.Client.Update(ctx, &sec)
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			return s.Ensure(ctx) // another replica wrote first: take its
		}
		if err != nil {
			return fmt.Errorf("write Secret %s: %w", s.Secret, err)
		}
		s.log().Info("webhook serving certificate issued", "secret", s.Secret.String(), "hosts", s.Hosts)
	}
	pair, err := tls.X509KeyPair(data[keyCert], data[keyKey])
	if err != nil {
		return err
	}
	s.cert.Store(&pair)
	return s.publishCA(ctx, data[keyCACert])
}

// complete returns the Secret's data with a CA and a current leaf for
// Hosts, and whether it had to make either.
func (s *ServingCert) complete(data map[string][]byte) (map[string][]byte, bool, error) {
	ca, err := pki.ParseCA(data[keyCACert], data[keyCAKey])
	if err == nil && s.leafGood(ca, data[keyCert], data[keyKey]) {
		return data, false, nil
	}
	if err != nil { // no CA yet, or an unreadable one: start over
		if ca, err = pki.NewCA("hoplink webhook CA"); err != nil {
			return nil, false, err
		}
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, false, err
	}
	certPEM, leafKey, err := ca.IssueServer(s.Hosts, s.validity())
	if err != nil {
		return nil, false, err
	}
	return map[string][]byte{keyCACert: ca.PEM, keyCAKey: keyPEM, keyCert: certPEM, keyKey: leafKey}, true, nil
}

// leafGood: the leaf chains to ca, names every host, and has more than a
// third of its validity left.
func (s *ServingCert) leafGood(ca *pki.CA, certPEM, keyPEM []byte) bool {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return false
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, h := range s.Hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: h}); err != nil {
			return false
		}
	}
	return time.Until(leaf.NotAfter) > s.validity()/3
}

// publishCA writes caPEM into every webhook of the configuration.
func (s *ServingCert) publishCA(ctx context.Context, caPEM []byte) error {
	if s.WebhookConfig == "" {
		return nil
	}
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := s.Client.Get(ctx, types.NamespacedName{Name: s.WebhookConfig}, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("MutatingWebhookConfiguration %s does not exist: pods labelled for a sidecar relay cannot be injected (install the chart's webhook, or pass --webhook-config=\"\" to run without one)", s.WebhookConfig)
		}
		return err
	}
	orig := cfg.DeepCopy()
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, caPEM) {
			cfg.Webhooks[i].ClientConfig.CABundle = slices.Clone(caPEM)
		}
	}
	if equalBundles(orig, &cfg) {
		return nil
	}
	if err := s.Client.Patch(ctx, &cfg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("caBundle of MutatingWebhookConfiguration %s: %w", s.WebhookConfig, err)
	}
	s.log().Info("webhook caBundle updated", "config", s.WebhookConfig)
	return nil
}

func equalBundles(a, b *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	for i := range a.Webhooks {
		if !bytes.Equal(a.Webhooks[i].ClientConfig.CABundle, b.Webhooks[i].ClientConfig.CABundle) {
			return false
		}
	}
	return true
}
