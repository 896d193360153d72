package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/pki"
)

// serveLoopback accepts on a loopback port and hands each connection to f.
func serveLoopback(t *testing.T, f func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); f(c) }()
		}
	}()
	return ln.Addr().String()
}

// What a RelayNode's writer learns of an endpoint of its choosing that the
// operator dialed: one of a few words, never what answered there (before:
// the certificate's names, "does not look like a TLS handshake", ...).
func TestReachErrorsSayLittle(t *testing.T) {
	other, _ := pki.NewCA("someone else's")
	certPEM, keyPEM, err := other.IssueServer([]string{"internal-db.corp.example", "kubernetes.default.svc"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	closed := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		return ln.Addr().String()
	}()
	ca, _ := pki.NewCA("ours")
	a := newRelayAdmin(nil, ca)
	for _, tc := range []struct {
		name, endpoint, says string
	}{
		{"a service that speaks no TLS", serveLoopback(t, func(c net.Conn) { io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n") }), "could not be asked"},
		{"a TLS service of another CA", serveLoopback(t, func(c net.Conn) {
			tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
		}), "could not be asked"},
		{"a closed port", closed, "refused the connection"},
		{"a silent port", serveLoopback(t, func(c net.Conn) { io.Copy(io.Discard, c) }), "did not answer in time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			// As the route controller asks, whose errors become the
			// Chain's Events and conditions.
			_, err := eachEndpoint("hk", []string{tc.endpoint}, func(ep string) (*adminapi.Status, error) { return a.api.Status(ctx, "hk", ep) })
			if err == nil {
				t.Fatal("answered")
			}
			got := err.Error()
			if !strings.Contains(got, tc.endpoint+" "+tc.says) {
				t.Fatalf("%q, want it to say %q", got, tc.says)
			}
			for _, leak := range []string{"internal-db", "kubernetes", "TLS handshake", "HTTP", "x509", "certificate"} {
				if strings.Contains(got, leak) {
					t.Errorf("%q tells %q", got, leak)
				}
			}
		})
	}
	// A relay's own refusal is the relay's to tell.
	refusal := fmt.Errorf("GET ...: %w", &adminapi.Error{Status: 404, Reason: "not_member", Msg: "relay hk is not on Chain default/c"})
	if got := reachError("10.0.0.1:7401", refusal).Error(); !strings.Contains(got, "relay hk is not on Chain default/c (not_member)") {
		t.Errorf("a relay's refusal: %q", got)
	}
}
