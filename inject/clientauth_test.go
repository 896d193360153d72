package inject

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
)

func leafOf(t *testing.T, ca *pki.CA, name string) [][]byte {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c.Certificate
}

// TestClientAuth: callers need a certificate of the CA file, for one of
// the names; a CA written into the file later (a ConfigMap the kubelet
// updates) is taken without a restart, and a file that goes away keeps
// the last CAs rather than refusing everyone.
func TestClientAuth(t *testing.T) {
	old, _ := pki.NewCA("old")
	next, _ := pki.NewCA("next")
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, old.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClientAuth(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Error("a missing CA file was taken")
	}
	a, err := NewClientAuth(file, []string{"apiserver"})
	if err != nil {
		t.Fatal(err)
	}
	var c tls.Config
	a.Apply(&c)
	if c.ClientAuth != tls.RequireAnyClientCert || c.VerifyPeerCertificate == nil {
		t.Fatalf("Apply: %v", c.ClientAuth)
	}
	check := func(what string, raw [][]byte, ok bool) {
		t.Helper()
		if err := c.VerifyPeerCertificate(raw, nil); (err == nil) != ok {
			t.Errorf("%s: %v", what, err)
		}
	}
	check("no certificate", nil, false)
	check("the CA's, for the name", leafOf(t, old, "apiserver"), true)
	check("the CA's, for another name", leafOf(t, old, "system:node:n1"), false)
	check("another CA's", leafOf(t, next, "apiserver"), false)

	if err := os.WriteFile(file, append(old.PEM, next.PEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.checked = time.Now().Add(-reloadEvery)
	a.mu.Unlock()
	check("the new CA's, once the file has it", leafOf(t, next, "apiserver"), true)

	os.Remove(file)
	a.mu.Lock()
	a.checked = time.Now().Add(-reloadEvery)
	a.mu.Unlock()
	check("the CA's, with the file gone a moment", leafOf(t, old, "apiserver"), true)
}
