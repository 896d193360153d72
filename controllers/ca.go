package controllers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/pki"
)

// Keys of the Secrets the operator writes. Relay Secrets use the layout of
// kubernetes.io/tls plus the CA certificate, as cert-manager does.
const (
	keyCert   = corev1.TLSCertKey       // tls.crt
	keyKey    = corev1.TLSPrivateKeyKey // tls.key
	keyCACert = "ca.crt"
)

// LoadOrCreateCA returns the CA kept in the named Secret. When the Secret does
// not exist and create is true, it makes a new CA and stores it there; when
// create is false (a CA the user named), a missing Secret is an error.
func LoadOrCreateCA(ctx context.Context, c client.Client, key types.NamespacedName, create bool) (*pki.CA, error) {
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	switch {
	case err == nil:
		ca, err := pki.ParseCA(s.Data[keyCert], s.Data[keyKey])
		if err != nil {
			return nil, fmt.Errorf("CA Secret %s: %w (it needs %s and %s in PEM)", key, err, keyCert, keyKey)
		}
		// ca.crt, when present, is what relays trust: the old and the new
		// CA while one replaces the other.
		if b := s.Data[keyCACert]; len(b) > 0 {
			if err := ca.SetTrust(b); err != nil {
				return nil, fmt.Errorf("CA Secret %s: %s: %w", key, keyCACert, err)
			}
		}
		return ca, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("read CA Secret %s: %w", key, err)
	case !create:
		return nil, fmt.Errorf("CA Secret %s does not exist: create it (keys %s, %s) or leave --ca-secret unset to let the operator make one", key, keyCert, keyKey)
	}
	ca, err := pki.NewCA("hoplink relay CA")
	if err != nil {
		return nil, err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{labelManagedBy: managerName}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{keyCert: ca.PEM, keyKey: keyPEM},
	}
	if err := c.Create(ctx, &s); err != nil {
		if apierrors.IsAlreadyExists(err) { // another operator replica won the race
			return LoadOrCreateCA(ctx, c, key, false)
		}
		return nil, fmt.Errorf("create CA Secret %s: %w", key, err)
	}
	return ca, nil
}

// certNotAfter returns the expiry of the first certificate in PEM data.
func certNotAfter(data []byte) (time.Time, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return time.Time{}, errors.New("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return time.Time{}, err
	}
	return cert.NotAfter, nil
}
