package adminapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hoplink/hoplink/internal/printable"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/pki"
)

// Client calls relays' admin APIs as the operator.
type Client struct {
	roots *x509.CertPool
	cert  func() (*tls.Certificate, error)

	mu         sync.Mutex
	transports map[string]*http.Transport // by relay name: each verifies its own
}

// NewClient makes a client that trusts roots and presents cert's answer,
// asked at each handshake so that a renewed certificate is used at once.
func NewClient(roots *x509.CertPool, cert func() (*tls.Certificate, error)) *Client {
	return &Client{roots: roots, cert: cert, transports: map[string]*http.Transport{}}
}

// http talks to the relays of one RelayNode: the TLS config checks that the
// relay answering is the one named.
func (c *Client) http(relay string) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.transports[relay]
	if t == nil {
		t = &http.Transport{
			TLSClientConfig:     pki.AdminClientConfig(c.roots, c.cert, relay),
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
		}
		c.transports[relay] = t
	}
	return &http.Client{Transport: t}
}

// Links asks relay, at endpoint (host:port), for its table of chain
// (namespace/name), measured within fresh.
func (c *Client) Links(ctx context.Context, relay, endpoint, chain string, fresh time.Duration) (*measure.Table, error) {
	q := url.Values{"chain": {chain}, "fresh": {fresh.String()}}
	var t measure.Table
	if err := c.call(ctx, relay, http.MethodGet, endpoint, PathLinks, q, nil, &t); err != nil {
		return nil, err
	}
	if t.Relay != relay {
		return nil, fmt.Errorf("%s answered as relay %q, not %q", endpoint, t.Relay, relay)
	}
	return &t, nil
}

// Trace asks the entry relay of chain, at endpoint, to trace routes.
func (c *Client) Trace(ctx context.Context, relay, endpoint, chain string, routes [][]string) ([]measure.Trace, error) {
	body, err := json.Marshal(TraceRequest{Routes: routes})
	if err != nil {
		return nil, err
	}
	var res []measure.Trace
	if err := c.call(ctx, relay, http.MethodPost, endpoint, PathTrace, url.Values{"chain": {chain}}, body, &res); err != nil {
		return nil, err
	}
	if len(res) != len(routes) {
		return nil, fmt.Errorf("%s answered %d traces for %d routes", endpoint, len(res), len(routes))
	}
	return res, nil
}

// Status asks relay, at endpoint, what it sees go wrong.
func (c *Client) Status(ctx context.Context, relay, endpoint string) (*Status, error) {
	var s Status
	if err := c.call(ctx, relay, http.MethodGet, endpoint, PathStatus, nil, nil, &s); err != nil {
		return nil, err
	}
	if s.Relay != relay {
		return nil, fmt.Errorf("%s answered as relay %q, not %q", endpoint, s.Relay, relay)
	}
	return &s, nil
}

// ClusterSet asks relay, at endpoint, for its cluster's clusterset report,
// waiting up to wait for one whose version is not after. changed is false
// when the relay still holds version after (data is then nil).
func (c *Client) ClusterSet(ctx context.Context, relay, endpoint, after string, wait time.Duration) (data []byte, version string, changed bool, err error) {
	q := url.Values{"after": {after}, "wait": {wait.String()}}
	u := "https://" + endpoint + PathClusterSet + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, "", false, err
	}
	resp, err := c.http(relay).Do(req)
	if err != nil {
		return nil, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxReport+1))
	if err != nil {
		return nil, "", false, err
	}
	version = resp.Header.Get(VersionHeader)
	switch {
	case len(b) > MaxReport:
		return nil, "", false, fmt.Errorf("GET %s: answer larger than %d bytes", u, MaxReport)
	case resp.StatusCode == http.StatusNotModified:
		return nil, version, false, nil
	case resp.StatusCode != http.StatusOK:
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(b, e) != nil || e.Reason == "" {
			return nil, "", false, fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
		}
		return nil, "", false, fmt.Errorf("GET %s: %s: %w", u, resp.Status, e)
	case version == "":
		return nil, "", false, fmt.Errorf("GET %s: no %s in the answer", u, VersionHeader)
	}
	return b, version, true, nil
}

// call does one request and decodes its JSON answer; a refusal comes back
// as an *Error.
func (c *Client) call(ctx context.Context, relay, method, endpoint, path string, q url.Values, body []byte, v any) error {
	u := "https://" + endpoint + path + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.http(relay).Do(req)
	if err != nil {
		return unreached(endpoint, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	if err != nil {
		return err
	}
	if len(b) > MaxAnswer {
		return fmt.Errorf("%s %s: answer larger than %d bytes", method, u, MaxAnswer)
	}
	// What a relay answers is shown on terminals (hoplink status) and
	// copied into conditions and Events: printable text only.
	if resp.StatusCode != http.StatusOK {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(b, e) != nil || e.Reason == "" {
			return fmt.Errorf("%s %s: %s: %s", method, u, printable.String(resp.Status), printable.String(string(bytes.TrimSpace(b))))
		}
		printable.Strings(e)
		return fmt.Errorf("%s %s: %s: %w", method, u, printable.String(resp.Status), e)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return err
	}
	printable.Strings(v)
	return nil
}

// unreached says that a relay's admin API did not answer at endpoint, and
// why, without the request's URL: the path and query are ours, not the
// reader's, and the endpoint is what the reader can check.
func unreached(endpoint string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if strings.Contains(err.Error(), endpoint) {
		return err // a dial error names it already
	}
	return fmt.Errorf("%s: %w", endpoint, err)
}
