package main

import (
	"bytes"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/pki"
)

// 'cert show' judges each certificate of a directory and 'cert renew'
// renews those due: hk's expired, la's from another CA; the observer's,
// valid, is left alone. A relay keeps its key, and the renewed file its
// mode and owner.
func TestCertShowAndRenew(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	for _, args := range [][]string{{"cert", "ca", "--certs", dir}, {"cert", "issue", "--certs", dir, "hk", "la"}, {"cert", "observer", "--certs", dir}} {
		if out, err := execute(args...); err != nil || !strings.Contains(out, "wrote") {
			t.Fatalf("%v: %q, %v", args, out, err)
		}
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	ca, err := pki.LoadCA(f("ca.crt"), f("ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	hkKey, _ := os.ReadFile(f("hk.key"))
	pair, err := tls.LoadX509KeyPair(f("hk.crt"), f("hk.key"))
	if err != nil {
		t.Fatal(err)
	}
	pub := pair.Leaf.PublicKey
	expired, _, _, err := ca.IssueFor(pub, "", "hk", 30*time.Second) // from a minute ago
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f("hk.crt"), expired, 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(f("hk.crt"), 0o640)
	if os.Getuid() == 0 {
		if err := os.Chown(f("hk.crt"), 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	other, _ := pki.NewCA("other")
	laKey, _ := os.ReadFile(f("la.key"))
	laPair, _ := tls.LoadX509KeyPair(f("la.crt"), f("la.key"))
	foreign, _, _, _ := other.IssueFor(laPair.Leaf.PublicKey, "", "la", pki.RelayValidity)
	os.WriteFile(f("la.crt"), foreign, 0o644)

	out, err := execute("cert", "show", "--certs", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ca.crt        ca", "hk.crt        relay     hk", "la.crt        relay     la", "observer.crt  observer  observer.hoplink.dev"} {
		if !strings.Contains(out, want) {
			t.Errorf("cert show lacks %q:\n%s", want, out)
		}
	}
	for file, state := range map[string]string{"ca.crt": "valid", "hk.crt": "expired", "la.crt": "not from this CA", "observer.crt": "valid"} {
		if line := lineOf(out, file); !strings.HasSuffix(line, "  "+state) {
			t.Errorf("%s: %q, want state %q", file, line, state)
		}
	}
	if line := lineOf(out, "hk.crt"); !strings.Contains(line, "expired 0d ago") {
		t.Errorf("hk.crt LEFT: %q", line)
	}

	out, err = execute("cert", "renew", "--certs", dir)
	if err != nil {
		t.Fatalf("cert renew: %v\n%s", err, out)
	}
	for _, want := range []string{"hk.crt: renewed, valid until", "(was expired,", "la.crt: renewed", "(was not from this CA,", "observer.crt: valid until", "left as it is"} {
		if !strings.Contains(out, want) {
			t.Errorf("cert renew says no %q:\n%s", want, out)
		}
	}
	for name, key := range map[string][]byte{"hk": hkKey, "la": laKey} {
		if _, err := pki.LoadIdentity(name, f("ca.crt"), f(name+".crt"), f(name+".key")); err != nil {
			t.Errorf("%s after renew: %v", name, err)
		}
		if now, _ := os.ReadFile(f(name + ".key")); !bytes.Equal(now, key) {
			t.Errorf("%s.key changed without --new-key", name)
		}
	}
	st, _ := os.Stat(f("hk.crt"))
	if st.Mode().Perm() != 0o640 {
		t.Errorf("hk.crt mode %v after renew, want 0640 as before", st.Mode().Perm())
	}
	if s := st.Sys().(*syscall.Stat_t); os.Getuid() == 0 && (s.Uid != 65532 || s.Gid != 65532) {
		t.Errorf("hk.crt owner %d:%d after renew, want 65532:65532 as before", s.Uid, s.Gid)
	}
	if out, _ := execute("cert", "show", "--certs", dir, "hk", "la"); strings.Count(out, "  valid\n") != 2 {
		t.Errorf("after renew:\n%s", out)
	}
	if got, _ := completions(t, "cert", "renew", "--certs", dir, "hk", ""); strings.Join(got, " ") != "ca la observer" {
		t.Errorf("cert renew completes %q", got)
	}
	// Nothing due: nothing changes. --force --new-key: keys change too.
	before, _ := os.ReadFile(f("hk.crt"))
	execute("cert", "renew", "--certs", dir, "hk")
	if after, _ := os.ReadFile(f("hk.crt")); !bytes.Equal(before, after) {
		t.Error("a valid certificate was renewed without --force")
	}
	if _, err := execute("cert", "renew", "--certs", dir, "--force", "--new-key", "hk"); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(f("hk.key")); bytes.Equal(now, hkKey) {
		t.Error("--new-key kept the key")
	}
	if _, err := pki.LoadIdentity("hk", f("ca.crt"), f("hk.crt"), f("hk.key")); err != nil {
		t.Errorf("hk after --new-key: %v", err)
	}
}

func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimRight(l, " ")
		}
	}
	return ""
}

// 'cert renew' makes a certificate valid as 'cert issue' does: from
// pki.Backdate before, for as long (it backdated a minute, issue an hour).
func TestRenewedCertificatesSpanAsIssuedOnes(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"cert", "ca"}, {"cert", "issue", "hk"}} {
		if out, err := execute(append(args, "--certs", dir)...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	span := func() (time.Time, time.Duration) {
		c, err := readCert(filepath.Join(dir, "hk.crt"))
		if err != nil {
			t.Fatal(err)
		}
		return c.NotBefore, c.NotAfter.Sub(c.NotBefore)
	}
	_, issued := span()
	if out, err := execute("cert", "renew", "--certs", dir, "--force", "hk"); err != nil {
		t.Fatalf("cert renew: %v\n%s", err, out)
	}
	from, renewed := span()
	if renewed != issued {
		t.Errorf("cert renew made hk.crt valid for %v; cert issue, for %v", renewed, issued)
	}
	if ago := time.Since(from); ago < pki.Backdate || ago > pki.Backdate+time.Minute {
		t.Errorf("cert renew made hk.crt valid from %v ago, want %v", ago.Round(time.Second), pki.Backdate)
	}
}
