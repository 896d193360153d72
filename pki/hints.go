package pki

// The hints a relay's certificate files that fail to load add to the
// error: what to run or fix, since the files are the operator's to make.

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// mismatchHint says which files do not belong together.
func mismatchHint(err error, name, caFile, certFile string) string {
	var authority x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &authority):
		return fmt.Sprintf("; %s was not issued by the CA of %s: issue it again from that CA ('hoplink cert issue'), or put in %s the CA that issued it", certFile, caFile, caFile)
	case errors.As(err, &host):
		return fmt.Sprintf("; %s is another relay's: give relay %q its own (--certs DIR reads DIR/%s.crt and DIR/%s.key)", certFile, name, name, name)
	case strings.Contains(err.Error(), "private key does not match public key"):
		return "; the key is not the certificate's: copy both from one 'hoplink cert issue'"
	}
	return ""
}

// issueHint says how to make a relay's missing certificate files: the
// exact command when the CA's key is beside its certificate and the
// files go where 'hoplink cert issue' writes them.
func issueHint(name, caFile, certFile, keyFile string) string {
	dir := filepath.Dir(caFile)
	_, err := os.Stat(filepath.Join(dir, "ca.key"))
	if err == nil && certFile == filepath.Join(dir, name+".crt") && keyFile == filepath.Join(dir, name+".key") {
		return fmt.Sprintf("issue them with 'hoplink cert issue --certs %s %s'", dir, name)
	}
	return fmt.Sprintf("issue them with 'hoplink cert issue --certs DIR %s' where the CA's key is (it writes DIR/%s.crt and DIR/%s.key), then copy both to %s and %s", name, name, name, certFile, keyFile)
}

// validityHint says why a certificate is not valid now, when that is why:
// expired (renew it), or not valid yet (this host's clock is behind).
func validityHint(certPEM []byte, name string, now time.Time) string {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return ""
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return ""
	}
	switch {
	case now.After(c.NotAfter):
		return fmt.Sprintf("; it expired on %s: renew it with 'hoplink cert renew --certs DIR %s' where the CA's key is (if it should still be valid, this host's clock is ahead: it says %s)",
			c.NotAfter.UTC().Format(time.RFC3339), name, now.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Sprintf("; it is valid from %s, and this host's clock says %s: set the clock right (NTP: timedatectl set-ntp true)",
			c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return ""
}
