package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIdentityChecksNameAndCA(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue("hk")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewIdentity("hk", ca.PEM, cert, key); err != nil {
		t.Fatalf("valid identity refused: %v", err)
	}
	if _, err := NewIdentity("la", ca.PEM, cert, key); err == nil || !strings.Contains(err.Error(), `not valid for relay "la"`) {
		t.Fatalf("certificate for hk accepted as la: %v", err)
	}
	other, _ := NewCA("other")
	if _, err := NewIdentity("hk", other.PEM, cert, key); err == nil {
		t.Fatal("certificate accepted under a foreign CA")
	}
	_, otherKey, _ := ca.Issue("hk")
	if _, err := NewIdentity("hk", ca.PEM, cert, otherKey); err == nil {
		t.Fatal("certificate accepted with another certificate's key")
	}
}

func TestFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ca, _ := NewCA("test")
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("WriteCA overwrote an existing CA: %v", err)
	}
	loaded, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := loaded.WriteRelay(dir, "seattle"); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "seattle.key")); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	id, err := LoadIdentity("seattle", filepath.Join(dir, "ca.crt"), filepath.Join(dir, "seattle.crt"), filepath.Join(dir, "seattle.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(filepath.Join(dir, "seattle.crt"), filepath.Join(dir, "seattle.key")); err == nil {
		t.Fatal("a relay certificate was accepted as a CA")
	}
	k1, _ := id.DeriveKey("x")
	k2, _ := id.DeriveKey("x")
	k3, _ := id.DeriveKey("y")
	other, _ := loaded.Identity("seattle")
	k4, _ := other.DeriveKey("x")
	if k1 != k2 || k1 == k3 || k1 == k4 {
		t.Fatal("DeriveKey must be stable per key and label, and differ across keys and labels")
	}
}

func TestVerifyPeer(t *testing.T) {
	ca, _ := NewCA("test")
	id, _ := ca.Identity("hk")
	peer, _ := ca.Identity("la")
	if err := id.verifyPeer(peer.Cert.Certificate); err != nil {
		t.Fatalf("peer from the same CA refused: %v", err)
	}
	other, _ := NewCA("other")
	stranger, _ := other.Identity("la")
	if err := id.verifyPeer(stranger.Cert.Certificate); err == nil {
		t.Fatal("peer from a foreign CA accepted")
	}
	if err := id.verifyPeer(nil); err == nil {
		t.Fatal("peer without certificate accepted")
	}
	if err := id.verifyPeer([][]byte{[]byte("junk")}); err == nil {
		t.Fatal("unparsable certificate accepted")
	}
}

func TestRenewChecksAndSwapsTheCertificate(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.Identity("hk")
	if err != nil {
		t.Fatal(err)
	}
	first := id.Certificate().Leaf.SerialNumber
	other, _ := NewCA("other")
	c, k, _ := other.Issue("hk")
	if err := id.Renew(c, k); err == nil {
		t.Error("renewed with a certificate from another CA")
	}
	c, k, _ = ca.Issue("la")
	if err := id.Renew(c, k); err == nil {
		t.Error("renewed with another relay's certificate")
	}
	c, k, _ = ca.Issue("hk")
	if err := id.Renew(c, k); err != nil {
		t.Fatal(err)
	}
	if id.Certificate().Leaf.SerialNumber.Cmp(first) == 0 {
		t.Error("new handshakes would still present the old certificate")
	}
	if got, _ := id.ServerConfig(nil).GetCertificate(nil); got != id.Certificate() {
		t.Error("the server config does not present the renewed certificate")
	}
}

// A CA rotation in three steps: trust both CAs, take a certificate of the
// new one, drop the old. At no step does a relay distrust a peer that is
// one step ahead or behind; a step taken out of order is refused and
// changes nothing.
func TestUpdateRotatesTheCA(t *testing.T) {
	oldCA, _ := NewCA("old")
	newCA, _ := NewCA("new")
	id, err := oldCA.Identity("hk")
	if err != nil {
		t.Fatal(err)
	}
	oldPeer, _ := oldCA.Identity("la")
	newPeer, _ := newCA.Identity("la")
	bundle := append(append([]byte{}, oldCA.PEM...), newCA.PEM...)
	newCert, newKey, _ := newCA.Issue("hk")
	oldCert, oldKey, _ := oldCA.Issue("hk")

	// Out of order: a certificate of the new CA while trusting the old alone.
	if err := id.Update(oldCA.PEM, newCert, newKey); err == nil {
		t.Fatal("a certificate of a CA not in the CA file was taken")
	}
	if err := id.verifyPeer(newPeer.Cert.Certificate); err == nil {
		t.Fatal("a refused update changed the trust")
	}

	if err := id.Update(bundle, oldCert, oldKey); err != nil {
		t.Fatalf("step 1, trust both: %v", err)
	}
	for name, p := range map[string]*Identity{"old": oldPeer, "new": newPeer} {
		if err := id.verifyPeer(p.Cert.Certificate); err != nil {
			t.Errorf("step 1: a peer of the %s CA refused: %v", name, err)
		}
	}
	if err := id.Update(bundle, newCert, newKey); err != nil {
		t.Fatalf("step 2, a certificate of the new CA: %v", err)
	}
	if !id.Certificate().Leaf.Equal(mustLeaf(t, newCert)) {
		t.Error("step 2: handshakes do not present the new certificate")
	}
	if err := id.Update(newCA.PEM, newCert, newKey); err != nil {
		t.Fatalf("step 3, the new CA alone: %v", err)
	}
	if err := id.verifyPeer(oldPeer.Cert.Certificate); err == nil {
		t.Error("step 3: a peer of the dropped CA is still trusted")
	}
	if err := id.verifyPeer(newPeer.Cert.Certificate); err != nil {
		t.Errorf("step 3: a peer of the new CA refused: %v", err)
	}
	if c, k, _ := oldCA.Issue("hk"); id.Renew(c, k) == nil {
		t.Error("a renewal is checked against the CAs trusted now, not those loaded first")
	}
	if id.NotAfter() != id.Certificate().Leaf.NotAfter {
		t.Error("NotAfter is not the presented certificate's")
	}
}

func mustLeaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A relay's certificate files that are missing, expired or not valid yet
// fail with the command that makes or renews them, or the clock to fix.
func TestLoadIdentitySaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	f := func(n string) string { return filepath.Join(dir, n) }
	if _, err := LoadCA(f("ca.crt"), f("ca.key")); err == nil || !strings.Contains(err.Error(), "make a CA with 'hoplink cert ca --certs "+dir+"'") {
		t.Errorf("no CA: %v", err)
	}
	if _, err := LoadIdentity("hk", f("ca.crt"), f("hk.crt"), f("hk.key")); err == nil || !strings.Contains(err.Error(), "CA certificate: open "+f("ca.crt")) ||
		!strings.Contains(err.Error(), "'hoplink cert ca --certs DIR' makes a CA") {
		t.Errorf("no ca.crt: %v", err)
	}
	ca, _ := NewCA("test")
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIdentity("hk", f("ca.crt"), f("hk.crt"), f("hk.key")); err == nil || !strings.Contains(err.Error(), "no such file or directory: issue them with 'hoplink cert issue --certs "+dir+" hk'") {
		t.Errorf("no hk.crt, the CA's key beside: %v", err)
	}
	other := t.TempDir()
	if _, err := LoadIdentity("hk", f("ca.crt"), filepath.Join(other, "hk.crt"), filepath.Join(other, "hk.key")); err == nil ||
		!strings.Contains(err.Error(), "issue them with 'hoplink cert issue --certs DIR hk' where the CA's key is") {
		t.Errorf("no hk.crt elsewhere: %v", err)
	}
	// Expired a minute ago.
	cert, key, err := ca.issue("hk", -time.Minute, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f("hk.crt"), cert, 0o644)
	os.WriteFile(f("hk.key"), key, 0o600)
	if _, err := LoadIdentity("hk", f("ca.crt"), f("hk.crt"), f("hk.key")); err == nil || !strings.Contains(err.Error(), "renew it with 'hoplink cert renew --certs DIR hk'") {
		t.Errorf("expired: %v", err)
	}
	// Files that do not belong together.
	otherCA, _ := NewCA("other")
	otherCert, otherKey, _ := otherCA.Issue("hk")
	laCert, laKey, _ := ca.Issue("la")
	hkCert, _, _ := ca.Issue("hk")
	for _, tc := range []struct {
		cert, key []byte
		want      string
	}{
		{otherCert, otherKey, "; " + f("hk.crt") + " was not issued by the CA of " + f("ca.crt") + ": issue it again from that CA ('hoplink cert issue'), or put in " + f("ca.crt") + " the CA that issued it"},
		{laCert, laKey, "; " + f("hk.crt") + ` is another relay's: give relay "hk" its own (--certs DIR reads DIR/hk.crt and DIR/hk.key)`},
		{hkCert, laKey, "; the key is not the certificate's: copy both from one 'hoplink cert issue'"},
	} {
		os.WriteFile(f("hk.crt"), tc.cert, 0o644)
		os.WriteFile(f("hk.key"), tc.key, 0o600)
		if _, err := LoadIdentity("hk", f("ca.crt"), f("hk.crt"), f("hk.key")); err == nil || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%v, want it to end %q", err, tc.want)
		}
	}
	// Issued now, read by a host whose clock is a day behind.
	good, _, _ := ca.Issue("hk")
	if h := validityHint(good, "hk", time.Now().Add(-24*time.Hour)); !strings.Contains(h, "and this host's clock says") || !strings.Contains(h, "set the clock right") {
		t.Errorf("clock behind: %q", h)
	}
	if h := validityHint(good, "hk", time.Now()); h != "" {
		t.Errorf("a valid certificate: %q", h)
	}
}

// A relay's certificate is valid from Backdate before its issue, whether
// issued with a new key or renewed for the key it has, and for as long.
func TestIssueAndReissueBackdateAlike(t *testing.T) {
	ca, err := NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	certPEM, keyPEM, err := ca.Issue("hk")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ca.Reissue(pair.PrivateKey.(crypto.Signer).Public(), "hk")
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	for what, p := range map[string][]byte{"issued": certPEM, "reissued": again} {
		b, _ := pem.Decode(p)
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if c.NotBefore.Before(before.Add(-Backdate).Truncate(time.Second)) || c.NotBefore.After(after.Add(-Backdate)) {
			t.Errorf("%s: valid from %v, want %v before its issue (%v)", what, c.NotBefore, Backdate, before)
		}
		if span := c.NotAfter.Sub(c.NotBefore); span != RelayValidity+Backdate {
			t.Errorf("%s: valid for %v, want %v", what, span, RelayValidity+Backdate)
		}
	}
}
