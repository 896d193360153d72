package pki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
