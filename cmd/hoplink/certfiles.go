package main

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hoplink/hoplink/observe"
	"github.com/hoplink/hoplink/pki"
)

// Kinds of certificate file in a certificate directory.
const (
	kindCA       = "ca"
	kindRelay    = "relay"
	kindObserver = "observer"
)

// States of a certificate, from the most urgent.
const (
	stateExpired  = "expired"
	stateNotYet   = "not yet valid"
	stateOtherCA  = "not from this CA"
	stateRenew    = "renew"
	stateExpiring = "expires soon"
	stateValid    = "valid"
)

// certFile is one certificate of a directory, as 'cert show' lists it.
type certFile struct {
	File      string    `json:"file"`
	Name      string    `json:"name"`
	Kind      string    `json:"kind"`
	NotBefore time.Time `json:"notBefore"`
	NotAfter  time.Time `json:"notAfter"`
	// RenewFrom is when 'cert renew' renews it: --renew-before ahead of
	// NotAfter (a third of its validity unless given).
	RenewFrom time.Time `json:"renewFrom,omitzero"`
	State     string    `json:"state"`
	cert      *x509.Certificate
}

// due says whether 'cert renew' renews f.
func (f certFile) due() bool {
	return f.Kind != kindCA && f.State != stateValid && f.State != stateExpiring
}

// readCertFiles reads DIR/NAME.crt for each name, or every *.crt of dir,
// and judges each against the CA of dir/ca.crt at now.
func readCertFiles(dir string, names []string, now time.Time, renewBefore time.Duration) ([]certFile, error) {
	files := make([]string, 0, len(names))
	for _, n := range names {
		files = append(files, n+".crt")
	}
	if len(names) == 0 {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("--certs: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() && filepath.Ext(e.Name()) == ".crt" {
				files = append(files, e.Name())
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("--certs: %s holds no .crt file; 'hoplink cert ca --certs %s' makes a CA", dir, dir)
		}
	}
	var roots *x509.CertPool
	if b, err := os.ReadFile(filepath.Join(dir, "ca.crt")); err == nil {
		roots, _ = pki.ParseRoots(b)
	}
	var out []certFile
	for _, name := range files {
		c, err := readCert(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		f := certFile{File: name, Name: c.Subject.CommonName, NotBefore: c.NotBefore, NotAfter: c.NotAfter, cert: c}
		switch {
		case c.IsCA:
			f.Kind = kindCA
		case slices.Contains(c.DNSNames, pki.ObserverName):
			f.Kind, f.Name = kindObserver, pki.ObserverName
		default:
			f.Kind = kindRelay
			if len(c.DNSNames) == 1 {
				f.Name = c.DNSNames[0]
			}
		}
		if f.Kind != kindCA {
			before := renewBefore
			if before <= 0 {
				before = c.NotAfter.Sub(c.NotBefore) / 3
			}
			f.RenewFrom = c.NotAfter.Add(-before)
		}
		f.State = certState(f, roots, now)
		out = append(out, f)
	}
	return out, nil
}

func certState(f certFile, roots *x509.CertPool, now time.Time) string {
	switch {
	case now.After(f.NotAfter):
		return stateExpired
	case now.Before(f.NotBefore):
		return stateNotYet
	case f.Kind != kindCA && roots != nil && !fromCA(f.cert, roots, now):
		return stateOtherCA
	case f.Kind != kindCA && !now.Before(f.RenewFrom):
		return stateRenew
	case f.NotAfter.Sub(now) < observe.CertWarning:
		return stateExpiring
	}
	return stateValid
}

func fromCA(c *x509.Certificate, roots *x509.CertPool, now time.Time) bool {
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// left is the time until t, in days, as tables show it.
func left(t, now time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return fmt.Sprintf("expired %dd ago", int(-d.Hours()/24))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func writeCertTable(w io.Writer, files []certFile, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tKIND\tNAME\tNOT BEFORE\tNOT AFTER\tLEFT\tRENEW FROM\tSTATE")
	for _, f := range files {
		renew := "-"
		if !f.RenewFrom.IsZero() {
			renew = f.RenewFrom.UTC().Format(time.DateOnly)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.File, f.Kind, f.Name, f.NotBefore.UTC().Format(time.DateOnly),
			f.NotAfter.UTC().Format(time.DateOnly), left(f.NotAfter, now), renew, f.State)
	}
	return tw.Flush()
}

// renewCert issues f again from ca for as long as 'cert issue' does,
// for the same key unless newKey, and replaces the files in dir.
func renewCert(ca *pki.CA, dir string, f certFile, newKey bool) (time.Time, error) {
	base := strings.TrimSuffix(f.File, ".crt")
	certPath, keyPath := filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if f.Kind == kindObserver {
		// 'hoplink status' reads it afresh each run: a new pair is simplest.
		tmp, err := os.MkdirTemp(dir, ".renew-")
		if err != nil {
			return time.Time{}, err
		}
		defer os.RemoveAll(tmp)
		if err := ca.WriteObserver(tmp); err != nil {
			return time.Time{}, err
		}
		return replaceFromDir(tmp, map[string]string{pki.ObserverKey: keyPath, pki.ObserverCert: certPath})
	}
	if newKey {
		c, k, err := ca.Issue(f.Name)
		if err != nil {
			return time.Time{}, err
		}
		// The key first: a relay that reads the files between the two
		// renames finds a pair that does not match, keeps what it has,
		// and takes both at its next look (2 s).
		if err := replaceFile(keyPath, k, 0o600); err != nil {
			return time.Time{}, err
		}
		if err := replaceFile(certPath, c, 0o644); err != nil {
			return time.Time{}, err
		}
		return notAfter(c)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w (renew with --new-key to make a new key as well)", err)
	}
	certPEM, _ := os.ReadFile(certPath)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s, %s: %w (renew with --new-key to make a new key as well)", certPath, keyPath, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return time.Time{}, fmt.Errorf("%s: the key cannot sign", keyPath)
	}
	// Only the certificate changes, in one rename: a running relay picks
	// it up whole at its next look at the files, without a restart.
	c, err := ca.Reissue(signer.Public(), f.Name)
	if err != nil {
		return time.Time{}, err
	}
	if err := replaceFile(certPath, c, 0o644); err != nil {
		return time.Time{}, err
	}
	return notAfter(c)
}

func notAfter(certPEM []byte) (time.Time, error) {
	blk, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return time.Time{}, err
	}
	return c.NotAfter, nil
}

// replaceFromDir moves the files of tmp over their targets, the key
// first; it returns the certificate's expiry.
func replaceFromDir(tmp string, moves map[string]string) (time.Time, error) {
	var expiry time.Time
	for _, name := range []string{pki.ObserverKey, pki.ObserverCert} {
		b, err := os.ReadFile(filepath.Join(tmp, name))
		if err != nil {
			return time.Time{}, err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		} else if expiry, err = notAfter(b); err != nil {
			return time.Time{}, err
		}
		if err := replaceFile(moves[name], b, mode); err != nil {
			return time.Time{}, err
		}
	}
	return expiry, nil
}

// replaceFile writes data to path in one rename, so a reader sees the old
// file or the new, never part of one. The new file keeps the old one's
// mode and owner (a key made readable to a relay's user stays readable to
// it); a file that did not exist gets mode.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	uid, gid := -1, -1
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
		if s, ok := st.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(s.Uid), int(s.Gid)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return err
	}
	if uid >= 0 && (uid != os.Getuid() || gid != os.Getgid()) {
		if err := os.Chown(tmp.Name(), uid, gid); err != nil {
			return fmt.Errorf("%s: keeping its owner %d:%d: %w", path, uid, gid, err)
		}
	}
	return os.Rename(tmp.Name(), path)
}
