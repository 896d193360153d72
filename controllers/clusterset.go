package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/hoplink/hoplink/clusterset"
)

// MultiClusterOptions turn on the Multi-Cluster Services API
// (multicluster.x-k8s.io): ServiceExports of this cluster are imported
// into every cluster of its clusterset, and theirs into this one, carried
// by the relays.
type MultiClusterOptions struct {
	// Gateway is the RelayNode (namespace/name) where this cluster's calls
	// to imported services enter the relays and other clusters' calls
	// leave them; its namespace is the relays' (the clusterset's Chains and
	// Tunnels live there). Empty: multicluster mode is off.
	Gateway types.NamespacedName
	// ClusterID names this cluster when no ClusterProperty
	// cluster.clusterset.k8s.io does (About API).
	ClusterID string
	// ClusterSet names the clusterset when no ClusterProperty
	// clusterset.k8s.io does.
	ClusterSet string
	// Mode routes the Chains that enter here: sum (default) or pipe.
	Mode string
	// Ports are the listen ports the gateway gives imports' Tunnels,
	// first and last (default 40000-44999).
	Ports [2]int32
	// CoreDNS names the ConfigMap (and the Deployment) of CoreDNS whose
	// Corefile the operator keeps the clusterset zone in; empty: none.
	CoreDNS types.NamespacedName
}

// On reports whether multicluster mode is on.
func (o MultiClusterOptions) On() bool { return o.Gateway.Name != "" }

// Default listen ports of imports' Tunnels on the gateway.
const (
	DefaultImportPortFirst = 40000
	DefaultImportPortLast  = 44999
)

// Check says what is wrong with the options, naming the flag.
func (o MultiClusterOptions) Check() error {
	if !o.On() {
		return nil
	}
	if msgs := validation.IsDNS1123Label(o.ClusterID); len(msgs) > 0 {
		return fmt.Errorf("cluster ID %q (--cluster-id, or the ClusterProperty cluster.clusterset.k8s.io): %s; it names DNS records, so it must be a DNS label such as \"east-1\"",
			o.ClusterID, strings.Join(msgs, "; "))
	}
	if o.Gateway.Namespace == "" || len(validation.IsDNS1123Label(o.Gateway.Name)) > 0 {
		return fmt.Errorf("--mcs-gateway %q: want NAMESPACE/NAME of a RelayNode", o.Gateway)
	}
	switch o.Mode {
	case "", "sum", "pipe":
	default:
		return fmt.Errorf("--mcs-route-mode %q: want sum or pipe", o.Mode)
	}
	if o.Ports[0] < 1 || o.Ports[1] > 65535 || o.Ports[0] > o.Ports[1] {
		return fmt.Errorf("--mcs-ports %d-%d: want FIRST-LAST within 1-65535", o.Ports[0], o.Ports[1])
	}
	return nil
}

// Timing of what the clusters tell each other.
const (
	// downAfter: a cluster whose relays failed to answer for this long is
	// down: flows go to other clusters that serve its ports.
	downAfter = 3 * time.Second
	// forgetAfter: a cluster down this long no longer exports anything.
	forgetAfter = 10 * time.Minute
	// syncWait: after start, imports are not deleted for want of a remote
	// export until every other cluster answered once, or this passed.
	syncWait = 15 * time.Second
)

// remote is the latest report of another cluster, and how it is reached.
type remote struct {
	report *clusterset.Report
	relay  string    // who served it
	gen    int64     // its generation
	ok     time.Time // when a relay of the cluster last answered
	// failing is when its relays' answers stopped coming (a read that
	// failed), zero while they come.
	failing time.Time
}

// down reports whether the cluster's relays stopped answering: a read
// failed and none answered since for downAfter, or none answered for as
// long as a read may wait and then some.
func (r *remote) down(now time.Time) bool {
	return !r.failing.IsZero() && now.Sub(r.failing) > downAfter || now.Sub(r.ok) > pollWait+downAfter
}

// clusterSet is what the operator knows of its clusterset: this cluster's
// own exports, allocations and copies (kept by the reconcilers), the
// reports of the others (kept by the poller), and the merged services. It
// tells the reconcilers what changed, service by service.
type clusterSet struct {
	o     MultiClusterOptions
	self  string // cluster ID
	ns    string // the relays' namespace
	log   *slog.Logger
	start time.Time

	mu       sync.Mutex
	exports  map[string]*clusterset.Export // this cluster's valid exports by namespace/name
	entries  map[string]clusterset.Entry   // listen ports given to Tunnels entering here, by Tunnel
	seen     map[string]int64              // other clusters' entries copied here
	missing  map[string]bool               // imports without a namespace here
	local    []string                      // this cluster's relays in ns
	known    []string                      // every RelayNode of ns
	remotes  map[string]*remote            // by cluster
	answered map[string]bool               // relays polled that answered once
	polled   map[string]bool               // relays being polled
	services map[string]*clusterset.Service
	prints   map[string][32]byte // what each service's reconcilers last saw
	// published are the exports in the report stored last.
	published map[string]bool
	gen       int64 // generation of the report stored last
	// dirty: something changed since the last merge, which Start does
	// when kicked; lastLiveness is liveness at that merge.
	dirty        bool
	kick         chan struct{}
	lastLiveness string

	imports *keySource    // namespace/name of a service whose import changed
	exportC *keySource    // namespace/name of an export whose status may change
	relays  *keySource    // the Chains and Tunnels to build again (one key)
	publish chan struct{} // the report changed
}

// exchange is the clusterSet as the clusters' exchange of reports keeps
// it: the poller's news of the other clusters (their reports, whether
// their relays answer), and the publisher's of this one's stored report.
// The reconcilers read and keep the rest (clusterSet); one lock holds both.
type exchange struct{ *clusterSet }

func newClusterSet(o MultiClusterOptions, log *slog.Logger) *clusterSet {
	if o.Mode == "" {
		o.Mode = "sum"
	}
	return &clusterSet{o: o, self: o.ClusterID, ns: o.Gateway.Namespace, log: log, start: time.Now(),
		exports: map[string]*clusterset.Export{}, entries: map[string]clusterset.Entry{}, seen: map[string]int64{},
		missing: map[string]bool{}, remotes: map[string]*remote{}, answered: map[string]bool{}, polled: map[string]bool{},
		services: map[string]*clusterset.Service{}, prints: map[string][32]byte{}, published: map[string]bool{},
		imports: newKeySource(), exportC: newKeySource(), relays: newKeySource(), publish: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
}

// report is this cluster's report as it stands (generation aside).
func (cs *clusterSet) report() *clusterset.Report {
	r := &clusterset.Report{Cluster: cs.self, ClusterSet: cs.o.ClusterSet, Gateway: cs.o.Gateway.Name,
		Local: slices.Clone(cs.local), Known: slices.Clone(cs.known), Mode: cs.o.Mode, Seen: maps.Clone(cs.seen)}
	for _, k := range slices.Sorted(maps.Keys(cs.exports)) {
		r.Exports = append(r.Exports, *cs.exports[k])
	}
	for _, k := range slices.Sorted(maps.Keys(cs.entries)) {
		r.Entries = append(r.Entries, cs.entries[k])
	}
	r.Missing = slices.Sorted(maps.Keys(cs.missing))
	if len(r.Seen) == 0 {
		r.Seen = nil
	}
	return r
}

// Report is this cluster's report as it stands.
func (cs exchange) Report() *clusterset.Report {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.report()
}

// reports are the reports merged: this cluster's and those of the others
// not forgotten, by cluster ID.
func (cs *clusterSet) reports(now time.Time) []*clusterset.Report {
	out := []*clusterset.Report{cs.report()}
	for _, c := range slices.Sorted(maps.Keys(cs.remotes)) {
		if r := cs.remotes[c]; now.Sub(r.ok) < forgetAfter {
			out = append(out, r.report)
		}
	}
	return out
}

// Reports are the reports merged now.
func (cs *clusterSet) Reports() []*clusterset.Report {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.reports(time.Now())
}

// Down are the clusters whose relays have not answered for downAfter.
func (cs *clusterSet) Down() map[string]bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := map[string]bool{}
	now := time.Now()
	for c, r := range cs.remotes {
		if r.down(now) {
			out[c] = true
		}
	}
	return out
}

// Service is the merged service of namespace/name, or nil.
func (cs *clusterSet) Service(key string) *clusterset.Service {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.services[key]
}

// Services are every merged service.
func (cs *clusterSet) Services() []*clusterset.Service {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]*clusterset.Service, 0, len(cs.services))
	for _, k := range slices.Sorted(maps.Keys(cs.services)) {
		out = append(out, cs.services[k])
	}
	return out
}

// Synced reports whether every other cluster polled has answered once, or
// the operator started long enough ago: before, a service missing from the
// merge may only be missing its remote exports.
func (cs *clusterSet) Synced() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if time.Since(cs.start) > syncWait {
		return true
	}
	for r := range cs.polled {
		if !cs.answered[r] {
			return false
		}
	}
	return true
}

// Published reports whether the report stored last holds the export.
func (cs *clusterSet) Published(key string) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.published[key]
}

// SetExport records this cluster's export of key (nil: none, or invalid).
func (cs *clusterSet) SetExport(key string, e *clusterset.Export) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := cs.exports[key]
	if e == nil {
		if old == nil {
			return
		}
		delete(cs.exports, key)
	} else {
		if old != nil && fingerprint(old) == fingerprint(e) {
			return
		}
		cs.exports[key] = e
	}
	cs.changed()
}

// SetRelays records the relays of the namespace: this cluster's own, and
// every one it knows.
func (cs *clusterSet) SetRelays(local, known []string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if slices.Equal(local, cs.local) && slices.Equal(known, cs.known) {
		return
	}
	cs.local, cs.known = local, known
	cs.changed()
}

// SetMissing records whether key cannot be imported here for want of its
// namespace.
func (cs *clusterSet) SetMissing(key string, missing bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.missing[key] == missing {
		return
	}
	if missing {
		cs.missing[key] = true
	} else {
		delete(cs.missing, key)
	}
	cs.changed()
}

// SetCopies records the listen ports given to Tunnels entering here and
// what this cluster holds of the others' entries.
func (cs *clusterSet) SetCopies(entries map[string]clusterset.Entry, seen map[string]int64) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if maps.Equal(entries, cs.entries) && maps.Equal(seen, cs.seen) {
		return
	}
	cs.entries, cs.seen = entries, seen
	cs.changed()
}

// SetRemote records a report of another cluster, served by relay; an older
// generation than the one held changes nothing but the time it answered.
func (cs exchange) SetRemote(relay string, r *clusterset.Report, gen int64) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.answered[relay] = true
	now := time.Now()
	old := cs.remotes[r.Cluster]
	if old != nil && old.gen >= gen {
		wasDown := old.down(now)
		old.ok, old.failing = now, time.Time{}
		if wasDown {
			cs.changed()
		}
		return
	}
	cs.remotes[r.Cluster] = &remote{report: r, relay: relay, gen: gen, ok: now}
	cs.changed()
}

// Answered records that a relay of cluster answered (a wait that ended
// with nothing new).
func (cs exchange) Answered(relay, cluster string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.answered[relay] = true
	if r := cs.remotes[cluster]; r != nil {
		now := time.Now()
		wasDown := r.down(now)
		r.ok, r.failing = now, time.Time{}
		if wasDown {
			cs.changed()
		}
	}
}

// Failed records that a read of cluster's report from relay failed.
func (cs exchange) Failed(relay, cluster string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if r := cs.remotes[cluster]; r != nil && r.failing.IsZero() {
		r.failing = time.Now()
	}
}

// Polling records the relays polled now.
func (cs exchange) Polling(relays []string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.polled = map[string]bool{}
	for _, r := range relays {
		cs.polled[r] = true
	}
}

// Tick looks for clusters that went down (or were forgotten) since the
// last look, and tells whoever depends on them.
func (cs exchange) Tick() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.liveness(time.Now()) != cs.lastLiveness {
		cs.changed()
	}
}

// Stored records the report stored, of generation gen.
func (cs exchange) Stored(r *clusterset.Report, gen int64) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.gen = gen
	published := map[string]bool{}
	for _, e := range r.Exports {
		published[e.Key()] = true
	}
	for k := range published {
		if !cs.published[k] {
			cs.exportC.Add(k)
		}
	}
	for k := range cs.published {
		if !published[k] {
			cs.exportC.Add(k)
		}
	}
	cs.published = published
}

// changed marks the merge stale: Start merges again soon after, once for
// a burst of changes (an apply of a thousand exports is a thousand of
// them). Called with mu held.
func (cs *clusterSet) changed() {
	cs.dirty = true
	select {
	case cs.kick <- struct{}{}:
	default:
	}
}

// Start merges again after changes until ctx ends (a manager's Runnable,
// on the leader, where the changes come from).
func (cs *clusterSet) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-cs.kick:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
		cs.mu.Lock()
		if cs.dirty {
			cs.dirty = false
			cs.recompute()
		}
		cs.mu.Unlock()
	}
}

// liveness is which clusters are down and which forgotten, as one string.
func (cs *clusterSet) liveness(now time.Time) string {
	var b strings.Builder
	for _, c := range slices.Sorted(maps.Keys(cs.remotes)) {
		r := cs.remotes[c]
		fmt.Fprintf(&b, "%s:%v:%v ", c, r.down(now), now.Sub(r.ok) >= forgetAfter)
	}
	return b.String()
}

// recompute merges again and tells the reconcilers of every service whose
// merge, or what this cluster can reach of it, changed. Called with mu held.
func (cs *clusterSet) recompute() {
	now := time.Now()
	merged := clusterset.Merge(cs.reports(now))
	cs.lastLiveness = cs.liveness(now)
	down := map[string]bool{}
	for c, r := range cs.remotes {
		down[c] = r.down(now)
	}
	next := make(map[string]*clusterset.Service, len(merged))
	for _, s := range merged {
		next[s.Key()] = s
	}
	for k := range cs.prints {
		if next[k] == nil {
			delete(cs.prints, k)
			cs.notify(k)
		}
	}
	for k, s := range next {
		p := cs.printOf(s, down)
		if p != cs.prints[k] {
			cs.prints[k] = p
			cs.notify(k)
		}
	}
	cs.services = next
	cs.relays.Add(cs.ns + "/" + relaysKey)
	select {
	case cs.publish <- struct{}{}:
	default:
	}
}

// notify tells the import and export reconcilers of key.
func (cs *clusterSet) notify(key string) {
	cs.imports.Add(key)
	cs.exportC.Add(key)
}

// relaysKey is the one key of the reconciler of the clusterset's Chains
// and Tunnels.
const relaysKey = "clusterset"

// printOf is what a service's reconcilers depend on: every cluster's
// export of it, who lacks its namespace, which clusters are down, and
// which of its Tunnels entering here the exporters hold.
func (cs *clusterSet) printOf(s *clusterset.Service, down map[string]bool) [32]byte {
	type usable struct {
		Tunnel string
		Port   int32
		Held   bool
	}
	var v struct {
		Exports []*clusterset.Export
		Lacking []string
		Down    []string
		Tunnels []usable
	}
	for _, c := range s.Exporters {
		v.Exports = append(v.Exports, s.Export(c))
		if down[c] {
			v.Down = append(v.Down, c)
		}
	}
	v.Lacking = s.Lacking
	if s.Spec.Type == mcsv1beta1.ClusterSetIP {
		for i, p := range s.Spec.Ports {
			for _, src := range s.Serving[i] {
				name := clusterset.TunnelName(cs.self, src, s.Namespace, s.Name, p.Protocol, p.Port)
				if e, ok := cs.entries[name]; ok {
					v.Tunnels = append(v.Tunnels, usable{name, e.Port, cs.remoteSeen(src) >= e.Seq})
				}
			}
		}
	}
	b, _ := json.Marshal(v)
	return sha256.Sum256(b)
}

// remoteSeen is how far cluster c has copied this cluster's entries.
func (cs *clusterSet) remoteSeen(c string) int64 {
	if r := cs.remotes[c]; r != nil {
		return r.report.Seen[cs.self]
	}
	return 0
}

// Listen are the listen ports of the Tunnels entering here that their
// source cluster holds too: those clients may use.
func (cs *clusterSet) Listen() map[string]int32 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := map[string]int32{}
	for _, s := range cs.services {
		if s.Spec.Type != mcsv1beta1.ClusterSetIP {
			continue
		}
		for i, p := range s.Spec.Ports {
			for _, src := range s.Serving[i] {
				name := clusterset.TunnelName(cs.self, src, s.Namespace, s.Name, p.Protocol, p.Port)
				if e, ok := cs.entries[name]; ok && cs.remoteSeen(src) >= e.Seq {
					out[name] = e.Port
				}
			}
		}
	}
	return out
}

func fingerprint(e *clusterset.Export) [32]byte {
	b, _ := json.Marshal(e)
	return sha256.Sum256(b)
}
