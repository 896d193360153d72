package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// AdminClientConfig is the TLS config of the operator calling a relay's
// admin API: the relay must present a certificate from the CA for its name.
func AdminClientConfig(roots *x509.CertPool, cert func() (*tls.Certificate, error), relay string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		RootCAs:              roots,
		ServerName:           relay,
		NextProtos:           []string{AdminALPN},
	}
}

// ServerConfig is the TLS config of a relay's listener: it requires a client
// certificate from the CA, and offers the protocols given (ALPN when none).
// The check is done here rather than by crypto/tls so that a rejected peer
// can be counted and logged, with the address it came from, through
// onReject.
func (id *Identity) ServerConfig(onReject func(remote net.Addr, err error), protos ...string) *tls.Config {
	if len(protos) == 0 {
		protos = []string{ALPN}
	}
	base := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return id.Certificate(), nil },
		ClientAuth:     tls.RequireAnyClientCert,
		NextProtos:     protos,
	}
	conf := base.Clone()
	// Each handshake gets a config that knows its client's address (quic-go
	// fills in ClientHelloInfo.Conn too).
	conf.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		var remote net.Addr
		if hello.Conn != nil {
			remote = hello.Conn.RemoteAddr()
		}
		c := base.Clone()
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			err := id.verifyPeer(raw)
			if err != nil && onReject != nil {
				onReject(remote, err)
			}
			return err
		}
		return c, nil
	}
	return conf
}

func (id *Identity) verifyPeer(raw [][]byte) error {
	if len(raw) == 0 {
		return errors.New("peer presented no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, der := range raw {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         id.Roots(),
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return fmt.Errorf("peer certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	return checkNamespace(id.Namespace, certs[0])
}

// ClientConfig is the TLS config for dialing the named peer: the peer must
// present a certificate from the CA for exactly that name, and of this
// relay's namespace (checkNamespace).
func (id *Identity) ClientConfig(peer string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.Certificate(), nil },
		RootCAs:              id.Roots(),
		ServerName:           peer,
		NextProtos:           []string{ALPN},
		// After crypto/tls verified the chain and the name.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("peer presented no certificate")
			}
			return checkNamespace(id.Namespace, cs.PeerCertificates[0])
		},
	}
}

// PeerName returns the relay name of a peer whose certificate was verified
// during the handshake (by ClientConfig's or ServerConfig's checks).
func PeerName(state tls.ConnectionState) (string, error) {
	if len(state.PeerCertificates) == 0 {
		return "", errors.New("peer presented no certificate")
	}
	leaf := state.PeerCertificates[0]
	if len(leaf.DNSNames) != 1 {
		return "", fmt.Errorf("peer certificate names %d relays, want 1", len(leaf.DNSNames))
	}
	return leaf.DNSNames[0], nil
}
