package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/observe"
	"github.com/hoplink/hoplink/pki"
)

// 'hoplink status' warns of every certificate in use that expires within
// 30 days, or has: relays' (as they report them), the CA's and the
// observer's, each with what to do. Others are not mentioned.
func TestStatusWarnsOfExpiringCertificates(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	// A CA with 19 days left, and an observer certificate of it with 10.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "short CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(20*24*time.Hour - time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	ca, err := pki.ParseCA(caPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ca.IssueObserver(10 * 24 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	okder, _ := x509.MarshalPKCS8PrivateKey(obs.PrivateKey)
	for name, data := range map[string][]byte{"ca.crt": caPEM, pki.ObserverCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: obs.Certificate[0]}),
		pki.ObserverKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: okder})} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	of := observeFlags{files: []string{"../../examples/local"}, certs: dir, output: "table"}
	if _, _, err := of.loadFiles(); err != nil {
		t.Fatal(err)
	}
	r := &observe.Report{Time: now, Ready: true, Relays: []observe.Relay{
		{Name: "hk", Status: &adminapi.Status{Ready: true, CertificateExpires: now.Add(5*24*time.Hour + time.Hour)}},
		{Name: "la", Status: &adminapi.Status{Ready: true, CertificateExpires: now.Add(200 * 24 * time.Hour)}},
		{Name: "seattle", Status: &adminapi.Status{Ready: true, CertificateExpires: now.Add(-time.Hour)}},
	}}
	r.Warnings = of.certWarnings(r, now)
	var out bytes.Buffer
	if err := observe.WriteReport(&out, r); err != nil {
		t.Fatal(err)
	}
	day := func(d time.Duration) string { return now.Add(d).UTC().Format(time.DateOnly) }
	for _, want := range []string{
		"warnings:\n",
		"relay hk's certificate expires on " + day(5*24*time.Hour+time.Hour) + " (in 5d): renew it where the CA's key is (hoplink cert renew --certs DIR hk) and copy hk.crt to its host",
		"relay seattle's certificate expired on " + day(-time.Hour) + ": renew it",
		`the CA "short CA" (` + filepath.Join(dir, "ca.crt") + ") expires on " + day(20*24*time.Hour-time.Hour) + " (in 19d): rotate it before then",
		"the observer's certificate (" + filepath.Join(dir, pki.ObserverCert) + ") expires on",
		"renew it: hoplink cert renew --certs " + dir + " observer",
		"\nready: every relay answers",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "relay la") || len(r.Warnings) != 4 {
		t.Errorf("%d warnings, want 4 (la's certificate has 200 days):\n%s", len(r.Warnings), out.String())
	}
}

// In a cluster relays' certificates hold for days (Secrets) or a day (pod
// certificates) and are renewed hours ahead: status --kube warns only of
// one that was not, where it warned of every relay's with a month's
// threshold.
func TestStatusKubeWarnsOnlyOfUnrenewedRelayCertificates(t *testing.T) {
	now := time.Now()
	of := observeFlags{relayWarning: clusterRelayWarning, relayFix: func(string) string { return "see the operator" }}
	r := &observe.Report{Time: now, Relays: []observe.Relay{
		{Name: "week", Status: &adminapi.Status{CertificateExpires: now.Add(5 * 24 * time.Hour)}},
		{Name: "pod", Status: &adminapi.Status{CertificateExpires: now.Add(9 * time.Hour)}},
		{Name: "late", Status: &adminapi.Status{CertificateExpires: now.Add(3 * time.Hour)}},
	}}
	got := of.certWarnings(r, now)
	if len(got) != 1 || !strings.Contains(got[0], "relay late's certificate expires") {
		t.Errorf("warnings %q, want one, of relay late", got)
	}
}
