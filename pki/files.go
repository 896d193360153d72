package pki

import (
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
)

// Observer files in a certificate directory.
const (
	ObserverCert = "observer.crt"
	ObserverKey  = "observer.key"
)

// WriteCA writes ca.crt and ca.key into dir, refusing to overwrite.
func (ca *CA) WriteCA(dir string) error {
	key, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{"ca.crt": ca.PEM, "ca.key": key})
}

// WriteRelay issues and writes NAME.crt and NAME.key into dir.
func (ca *CA) WriteRelay(dir, name string) error {
	c, k, err := ca.Issue(name)
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{name + ".crt": c, name + ".key": k})
}

// WriteObserver issues and writes the observer's client certificate
// (ObserverCert, ObserverKey) into dir.
func (ca *CA) WriteObserver(dir string) error {
	c, k, err := ca.issue(ObserverName, ObserverValidity, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil)
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{ObserverCert: c, ObserverKey: k})
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("%s exists; remove it first or choose another directory", filepath.Join(dir, name))
		}
	}
	for name, data := range files {
		mode := os.FileMode(0o644)
		if filepath.Ext(name) == ".key" {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, mode); err != nil {
			return err
		}
	}
	return nil
}
