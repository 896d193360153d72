package controllers

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/probe"
	"github.com/hoplink/hoplink/routectl"
)

// relayAdmin is the operator's route controller's Measurer: it reads the
// relays' measurements over their admin API, HTTPS on each relay's own
// port, authenticated both ways by the relay CA (the operator presents a
// certificate for pki.OperatorName). A RelayNode with several relays (a
// DaemonSet on several nodes) is asked at every endpoint, and their answers
// are merged by the median.
type relayAdmin struct {
	client client.Reader
	roots  *x509.CertPool
	ca     *pki.CA

	mu        sync.Mutex
	cert      tls.Certificate
	transport map[string]*http.Transport // by relay name: each verifies its own
}

// operatorCertValidity is how long the operator's client certificate is
// valid; a third before it ends, a new one is issued in memory.
const operatorCertValidity = 30 * 24 * time.Hour

func newRelayAdmin(c client.Reader, ca *pki.CA) *relayAdmin {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &relayAdmin{client: c, roots: roots, ca: ca, transport: map[string]*http.Transport{}}
}

// certificate is the operator's client certificate, renewed when a third of
// its validity is left.
func (a *relayAdmin) certificate() (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cert.Leaf == nil || time.Until(a.cert.Leaf.NotAfter) < operatorCertValidity/3 {
		c, err := a.ca.IssueOperator(operatorCertValidity)
		if err != nil {
			return nil, err
		}
		a.cert = c
	}
	c := a.cert
	return &c, nil
}

// httpClient talks to the relays of one RelayNode: the TLS config checks
// that the relay is the one named.
func (a *relayAdmin) httpClient(relay string) *http.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.transport[relay]
	if t == nil {
		t = &http.Transport{
			TLSClientConfig:     pki.AdminClientConfig(a.roots, a.certificate, relay),
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
		}
		a.transport[relay] = t
	}
	return &http.Client{Transport: t}
}

// endpoints are the addresses of a RelayNode's relays, as published in its
// status (its spec.endpoints, else its ready pods).
func (a *relayAdmin) endpoints(ctx context.Context, namespace, relay string) ([]string, error) {
	var rn v1alpha1.RelayNode
	if err := a.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: relay}, &rn); err != nil {
		return nil, err
	}
	eps := rn.Status.Endpoints
	if len(eps) == 0 {
		eps = rn.Spec.Endpoints
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("RelayNode %s/%s has no endpoints yet", namespace, relay)
	}
	return eps, nil
}

// each calls f on every endpoint of a relay at once and returns the answers
// that came, or why none did.
func each[T any](ctx context.Context, a *relayAdmin, namespace, relay string, f func(c *http.Client, ep string) (T, error)) ([]T, error) {
	eps, err := a.endpoints(ctx, namespace, relay)
	if err != nil {
		return nil, err
	}
	c := a.httpClient(relay)
	results := make([]T, len(eps))
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f(c, ep)
		}()
	}
	wg.Wait()
	var out []T
	for i := range eps {
		if errs[i] == nil {
			out = append(out, results[i])
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("relay %s: %w", relay, errors.Join(errs...))
	}
	return out, nil
}

func (a *relayAdmin) Links(ctx context.Context, req routectl.LinksRequest) (*probe.Table, error) {
	q := url.Values{"chain": {manifest.Key(req.Chain.Namespace, req.Chain.Name)}, "fresh": {req.Fresh.String()}}
	tables, err := each(ctx, a, req.Chain.Namespace, req.Relay, func(c *http.Client, ep string) (*probe.Table, error) {
		var t probe.Table
		err := call(ctx, c, http.MethodGet, "https://"+ep+"/v1/links?"+q.Encode(), nil, &t)
		if err == nil && t.Relay != req.Relay {
			err = fmt.Errorf("%s answered as relay %q", ep, t.Relay)
		}
		return &t, err
	})
	if err != nil {
		return nil, err
	}
	return mergeTables(tables), nil
}

func (a *relayAdmin) Pipe(ctx context.Context, ch *v1alpha1.Chain, routes [][]string) ([]probe.PipeResult, error) {
	q := url.Values{"chain": {manifest.Key(ch.Namespace, ch.Name)}}
	body, _ := json.Marshal(map[string][][]string{"routes": routes})
	answers, err := each(ctx, a, ch.Namespace, ch.Spec.Entry, func(c *http.Client, ep string) ([]probe.PipeResult, error) {
		var r []probe.PipeResult
		err := call(ctx, c, http.MethodPost, "https://"+ep+"/v1/pipe?"+q.Encode(), body, &r)
		if err == nil && len(r) != len(routes) {
			err = fmt.Errorf("%s answered %d results for %d routes", ep, len(r), len(routes))
		}
		return r, err
	})
	if err != nil {
		return nil, err
	}
	out := make([]probe.PipeResult, len(routes))
	for i, rt := range routes {
		var ok []time.Duration
		var errs []string
		for _, ans := range answers {
			if ans[i].Err == "" {
				ok = append(ok, ans[i].RTT.D())
			} else {
				errs = append(errs, ans[i].Err)
			}
		}
		out[i] = probe.PipeResult{Route: rt}
		if len(ok) == 0 {
			out[i].Err = fmt.Sprint(errs)
			continue
		}
		out[i].RTT = probe.Duration(median(ok))
	}
	return out, nil
}

// call does one admin request and decodes its JSON answer.
func call(ctx context.Context, c *http.Client, method, u string, body []byte, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, probe.MaxTableSize+1))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, v)
}

// mergeTables merges the tables of one RelayNode's relays: for each link and
// target, the measurement of the relay whose round trip is the median of
// those that got an answer.
func mergeTables(ts []*probe.Table) *probe.Table {
	if len(ts) == 1 {
		return ts[0]
	}
	out := &probe.Table{Relay: ts[0].Relay}
	links := map[string][]probe.Link{}
	var order []string
	targets := map[string][]probe.Target{}
	var torder []string
	for _, t := range ts {
		for _, l := range t.Links {
			if links[l.To] == nil {
				order = append(order, l.To)
			}
			links[l.To] = append(links[l.To], l)
		}
		for _, x := range t.Targets {
			if targets[x.Tunnel] == nil {
				torder = append(torder, x.Tunnel)
			}
			targets[x.Tunnel] = append(targets[x.Tunnel], x)
		}
	}
	for _, to := range order {
		out.Links = append(out.Links, medianOf(links[to], func(l probe.Link) (bool, probe.Duration) { return l.Up, l.RTT }))
	}
	for _, tn := range torder {
		out.Targets = append(out.Targets, medianOf(targets[tn], func(x probe.Target) (bool, probe.Duration) { return x.Up, x.RTT }))
	}
	return out
}

func medianOf[T any](xs []T, key func(T) (bool, probe.Duration)) T {
	var up []T
	for _, x := range xs {
		if ok, _ := key(x); ok {
			up = append(up, x)
		}
	}
	if len(up) == 0 {
		return xs[0]
	}
	slices.SortFunc(up, func(a, b T) int {
		_, ra := key(a)
		_, rb := key(b)
		return cmp.Compare(ra, rb)
	})
	return up[len(up)/2]
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
