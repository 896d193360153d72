package controllers

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/measure"
	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/routectl"
)

// relayAdmin is the operator's route controller's Measurer: it reads the
// relays' measurements over their admin API (adminapi), HTTPS on each
// relay's own port, authenticated both ways by the relay CA (the operator
// presents a certificate for pki.OperatorName). A RelayNode with several
// relays (a DaemonSet on several nodes) is asked at every endpoint, and
// their answers are merged by the median.
type relayAdmin struct {
	client client.Reader
	api    *adminapi.Client
	ca     *pki.CA

	mu   sync.Mutex
	cert tls.Certificate
}

// operatorCertValidity is how long the operator's client certificate is
// valid; a third before it ends, a new one is issued in memory.
const operatorCertValidity = 30 * 24 * time.Hour

func newRelayAdmin(c client.Reader, ca *pki.CA) *relayAdmin {
	// Relays' certificates chain to one of the CAs they trust: during a
	// rotation, some still to the old one.
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.TrustPEM()) {
		roots.AddCert(ca.Cert)
	}
	a := &relayAdmin{client: c, ca: ca}
	a.api = adminapi.NewClient(roots, a.certificate)
	return a
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

// endpoints are the addresses of a RelayNode's relays, as published in its
// status (its spec.endpoints, else its ready pods).
func (a *relayAdmin) endpoints(ctx context.Context, namespace, relay string) ([]string, error) {
	var rn v1alpha1.RelayNode
	if err := a.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: relay}, &rn); err != nil {
		return nil, err
	}
	eps := oneFamily(rn.Status.Endpoints)
	if len(eps) == 0 {
		eps = oneFamily(rn.Spec.Endpoints)
	}
	if rn.Spec.IsSidecar() {
		// Replicas of one relay: a few of them, a different few each round,
		// stand for all (their tables are merged like any relay's pods').
		var list discoveryv1.EndpointSliceList
		if err := a.client.List(ctx, &list, client.InNamespace(namespace),
			client.MatchingLabels{discoveryv1.LabelServiceName: RelayObjectName(relay)}); err != nil {
			return nil, err
		}
		reps := manifest.Replicas(list.Items, rn.Spec.RelayPort())
		rand.Shuffle(len(reps), func(i, j int) { reps[i], reps[j] = reps[j], reps[i] })
		eps = oneEach(reps[:min(len(reps), measuredReplicas)])
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("RelayNode %s/%s has no endpoints yet", namespace, relay)
	}
	return eps, nil
}

// measuredReplicas is how many replicas of a sidecar relay a round reads.
const measuredReplicas = 3

// oneEach is an endpoint of each replica, asked once however many
// families its pod has: of the family most of their endpoints have
// (oneFamily), else its first.
func oneEach(reps []manifest.Replica) []string {
	var all []string
	for _, r := range reps {
		all = append(all, r.Endpoints...)
	}
	keep := oneFamily(all)
	out := make([]string, 0, len(reps))
	for _, r := range reps {
		i := max(0, slices.IndexFunc(r.Endpoints, func(ep string) bool { return slices.Contains(keep, ep) }))
		out = append(out, r.Endpoints[i])
	}
	return out
}

// eachEndpoint calls f on every endpoint at once and returns the answers
// that came, or why none did (reachError).
func eachEndpoint[T any](relay string, eps []string, f func(ep string) (T, error)) ([]T, error) {
	results := make([]T, len(eps))
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if results[i], errs[i] = f(ep); errs[i] != nil {
				log.Log.V(1).Info("relay endpoint not asked", "relay", relay, "endpoint", ep, "err", errs[i].Error())
				errs[i] = reachError(ep, errs[i])
			}
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

func (a *relayAdmin) Links(ctx context.Context, req routectl.LinksRequest) (*measure.Table, error) {
	eps, err := a.endpoints(ctx, req.Chain.Namespace, req.Relay)
	if err != nil {
		return nil, err
	}
	chain := manifest.Key(req.Chain.Namespace, req.Chain.Name)
	tables, err := eachEndpoint(req.Relay, eps, func(ep string) (*measure.Table, error) {
		return a.api.Links(ctx, req.Relay, ep, chain, req.Fresh)
	})
	if err != nil {
		return nil, err
	}
	return mergeTables(tables), nil
}

func (a *relayAdmin) Trace(ctx context.Context, ch *v1alpha1.Chain, routes [][]string) ([]measure.Trace, error) {
	eps, err := a.endpoints(ctx, ch.Namespace, ch.Spec.Entry)
	if err != nil {
		return nil, err
	}
	chain := manifest.Key(ch.Namespace, ch.Name)
	answers, err := eachEndpoint(ch.Spec.Entry, eps, func(ep string) ([]measure.Trace, error) {
		return a.api.Trace(ctx, ch.Spec.Entry, ep, chain, routes)
	})
	if err != nil {
		return nil, err
	}
	return mergeTraces(routes, answers), nil
}

// mergeTraces merges the traces of one entry RelayNode's relays: for each
// route, the median of the round trips measured, or every relay's error.
func mergeTraces(routes [][]string, answers [][]measure.Trace) []measure.Trace {
	out := make([]measure.Trace, len(routes))
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
		out[i] = measure.Trace{Route: rt}
		if len(ok) == 0 {
			out[i].Err = fmt.Sprint(errs)
			continue
		}
		out[i].RTT = measure.Duration(median(ok))
	}
	return out
}

// mergeTables merges the tables of one RelayNode's relays: for each link and
// target, the measurement of the relay whose round trip is the median of
// those that got an answer.
func mergeTables(ts []*measure.Table) *measure.Table {
	if len(ts) == 1 {
		return ts[0]
	}
	out := &measure.Table{Relay: ts[0].Relay}
	links := map[string][]measure.Link{}
	var order []string
	targets := map[string][]measure.Target{}
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
		out.Links = append(out.Links, medianOf(links[to], func(l measure.Link) (bool, measure.Duration) { return l.Up, l.RTT }))
	}
	for _, tn := range torder {
		out.Targets = append(out.Targets, medianOf(targets[tn], func(x measure.Target) (bool, measure.Duration) { return x.Up, x.RTT }))
	}
	return out
}

func medianOf[T any](xs []T, key func(T) (bool, measure.Duration)) T {
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
