// Package observe is what `hoplink status` and `hoplink probe` see of a
// relay network: it asks every relay of the manifests for its status over
// the admin API (adminapi, with the observer's certificate), judges whether
// every chain and Tunnel is ready, measures a chain hop by hop, and renders
// the answers as tables. It changes nothing.
package observe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
)

// Report is the state of a relay network at one moment.
type Report struct {
	Time   time.Time `json:"time"`
	Relays []Relay   `json:"relays"`
	// Ready: every relay answered and is ready, every chain has a route
	// whose links are up, every Tunnel listens on its entry, and no exit
	// found its target refusing at its last connect.
	Ready bool `json:"ready"`
	// NotReady says what is not, one line each.
	NotReady []string `json:"notReady,omitempty"`
	// API is what the cluster's objects say (status --kube).
	API []Object `json:"api,omitempty"`
	// Imports are the ports of services imported from the clusterset that
	// enter the relays here (status --kube).
	Imports []Import `json:"imports,omitempty"`
	// Warnings are what needs doing soon, though everything works now:
	// certificates that expire within CertWarning, one line each.
	Warnings []string `json:"warnings,omitempty"`
	// RelaysNotAsked says why the report is the API's alone (status --kube
	// without an observer certificate): Relays is then empty, and Ready
	// means every object's Ready condition is True.
	RelaysNotAsked string `json:"relaysNotAsked,omitempty"`
}

// FromAPI is a report of what the API says alone, for whoever may read
// hoplink's objects but holds no observer certificate: the operator asks
// every relay it runs every 10 s and writes what they said into their
// conditions, so this is its view, that old at most.
func FromAPI(objs []Object, why string) *Report {
	r := &Report{Time: time.Now().UTC(), RelaysNotAsked: why}
	r.WithAPI(objs)
	return r
}

// CertWarning is how close to its expiry a certificate in use is warned of.
const CertWarning = 30 * 24 * time.Hour

// Relay is one relay's answer, or why there is none.
type Relay struct {
	Name     string           `json:"name"`
	Endpoint string           `json:"endpoint,omitempty"`
	Status   *adminapi.Status `json:"status,omitempty"`
	Err      string           `json:"error,omitempty"`
}

// Asker asks a relay at an endpoint for its status: adminapi.Client.
type Asker interface {
	Status(ctx context.Context, relay, endpoint string) (*adminapi.Status, error)
}

// Gather asks every relay of set at once, each at its endpoints in turn
// until one answers, and judges the answers.
func Gather(ctx context.Context, set *manifest.Set, a Asker) *Report {
	r := &Report{Time: time.Now().UTC(), Relays: make([]Relay, len(set.Relays))}
	var wg sync.WaitGroup
	for i, rn := range set.Relays {
		r.Relays[i].Name = rn.Name
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Relays[i] = ask(ctx, a, rn)
		}()
	}
	wg.Wait()
	slices.SortFunc(r.Relays, func(a, b Relay) int { return strings.Compare(a.Name, b.Name) })
	r.NotReady = judge(set, r)
	r.Ready = len(r.NotReady) == 0
	return r
}

func ask(ctx context.Context, a Asker, rn *v1alpha1.RelayNode) Relay {
	out := Relay{Name: rn.Name}
	if len(rn.Spec.Endpoints) == 0 {
		out.Err = "no spec.endpoints: nothing to ask it at"
		return out
	}
	var errs []string
	for _, ep := range rn.Spec.Endpoints {
		s, err := a.Status(ctx, rn.Name, ep)
		if err == nil {
			out.Endpoint, out.Status = ep, s
			return out
		}
		errs = append(errs, err.Error())
	}
	out.Endpoint = rn.Spec.Endpoints[0]
	out.Err = errs[0]
	if len(errs) > 1 {
		out.Err = fmt.Sprintf("%s (and %d more endpoints)", errs[0], len(errs)-1)
	}
	return out
}

// judge lists what keeps the network from being ready.
func judge(set *manifest.Set, r *Report) []string {
	var out []string
	byName := map[string]*adminapi.Status{}
	for _, rl := range r.Relays {
		switch {
		case rl.Status == nil:
			out = append(out, fmt.Sprintf("relay %s: no answer: %s", rl.Name, rl.Err))
		case rl.Status.Draining:
			out = append(out, fmt.Sprintf("relay %s: draining", rl.Name))
		case !rl.Status.Ready:
			out = append(out, fmt.Sprintf("relay %s: not ready", rl.Name))
		}
		byName[rl.Name] = rl.Status
	}
	for _, c := range set.Chains {
		key := manifest.Key(c.Namespace, c.Name)
		entry := byName[c.Spec.Entry]
		if entry == nil {
			continue // said above
		}
		rt := chainRoute(entry, key)
		if len(rt) == 0 {
			out = append(out, fmt.Sprintf("chain %s: no route yet", key))
			continue
		}
		for i := 0; i+1 < len(rt); i++ {
			from := byName[rt[i]]
			if from == nil {
				continue
			}
			if p := peerOf(from, rt[i+1]); p == nil || !p.Up {
				out = append(out, fmt.Sprintf("chain %s: link %s -> %s is down", key, rt[i], rt[i+1]))
			}
		}
	}
	for _, t := range set.Tunnels {
		key := manifest.Key(t.Namespace, t.Name)
		c := set.ChainOf(t)
		if c == nil {
			continue
		}
		entry := byName[c.Spec.Entry]
		if entry == nil {
			continue
		}
		for _, e := range entry.Entries {
			if e.Tunnel == key && !e.Open {
				out = append(out, fmt.Sprintf("tunnel %s: not open on %s: %s", key, c.Spec.Entry, e.Error))
			}
		}
		if exit := byName[c.Spec.Exit]; exit != nil {
			for _, d := range exit.TargetsDown {
				if d.Tunnel == key {
					out = append(out, fmt.Sprintf("tunnel %s: its exit %s cannot connect to the target %s (%s ago): %s; flows are reset: "+
						"check that it listens (a Service's endpoints, the port), or spec.target", key, c.Spec.Exit, d.Target, d.Age.D().Round(time.Second), d.Error))
				}
			}
		}
	}
	return out
}

func chainRoute(entry *adminapi.Status, chain string) []string {
	for _, c := range entry.Chains {
		if c.Chain == chain {
			return c.Route
		}
	}
	return nil
}

func peerOf(s *adminapi.Status, peer string) *adminapi.Peer {
	for i := range s.Peers {
		if s.Peers[i].Name == peer {
			return &s.Peers[i]
		}
	}
	return nil
}
