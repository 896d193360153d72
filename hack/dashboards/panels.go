package main

// The panels. Each query names only metrics that relays or the operator
// export (docs/architecture.md#metrics); $__rate_interval is Grafana's.

var ds = map[string]string{"type": "prometheus", "uid": "${datasource}"}

type target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat,omitempty"`
	RefID        string `json:"refId"`
	Format       string `json:"format,omitempty"`
	Instant      bool   `json:"instant,omitempty"`
}

type panel struct {
	Type        string            `json:"type"`
	Title       string            `json:"title"`
	Description string            `json:"description,omitempty"`
	GridPos     map[string]int    `json:"gridPos"`
	Datasource  map[string]string `json:"datasource,omitempty"`
	Targets     []target          `json:"targets,omitempty"`
	FieldConfig map[string]any    `json:"fieldConfig,omitempty"`
	Options     map[string]any    `json:"options,omitempty"`
	// Transformations turn query results into the frames a panel reads
	// (the network map's nodes and edges).
	Transformations []map[string]any `json:"transformations,omitempty"`
	Collapsed       *bool            `json:"collapsed,omitempty"`
	Panels          []panel          `json:"panels,omitempty"`
	ID              int              `json:"id"`
}

// layout places panels in rows of 24 columns.
type layout struct {
	y, x, id int
	panels   []panel
}

func (l *layout) row(title string) {
	if l.x > 0 {
		l.y += 8
		l.x = 0
	}
	f := false
	l.id++
	l.panels = append(l.panels, panel{Type: "row", Title: title, Collapsed: &f, ID: l.id,
		GridPos: map[string]int{"h": 1, "w": 24, "x": 0, "y": l.y}})
	l.y++
}

func (l *layout) add(w int, p panel) {
	if l.x+w > 24 {
		l.y += 8
		l.x = 0
	}
	l.id++
	p.ID = l.id
	p.GridPos = map[string]int{"h": 8, "w": w, "x": l.x, "y": l.y}
	p.Datasource = ds
	for i := range p.Targets {
		p.Targets[i].RefID = string(rune('A' + i))
	}
	l.panels = append(l.panels, p)
	l.x += w
}

func timeseries(title, unit, desc string, t ...target) panel {
	return panel{Type: "timeseries", Title: title, Description: desc, Targets: t,
		FieldConfig: map[string]any{"defaults": map[string]any{"unit": unit}, "overrides": []any{}}}
}

// relayOfInstance is 0 for each scrape address, labelled with the name of
// a relay it serves (one per pod; one of several in local mode): added to a
// process metric, it names the series by relay, not by address.
const relayOfInstance = `(0 * topk by (instance) (1, hoplink_relay_ready{relay=~"$relay"}))`

// currentRoutes keeps, of every relay's hoplink_chain_route_info, the
// entry's: the entry decides a routed chain's route, while a relay an old
// route crossed keeps exporting the route it last learned until a flow tells
// it otherwise. The entry is the route label's first relay.
const currentRoutes = `max by (chain, route) (hoplink_chain_route_info{relay=~"$relay", chain=~"$chain"} and on (chain, relay) ` +
	`label_replace(max by (chain, route) (hoplink_chain_route_info{relay=~"$relay", chain=~"$chain"}), "relay", "$1", "route", "([^,]+).*"))`

func q(expr, legend string) target { return target{Expr: expr, LegendFormat: legend} }

func panels() []panel {
	l := &layout{}

	l.row("Network")
	l.add(24, networkMap())

	l.row("Links")
	l.add(12, timeseries("Link round trip", "s",
		"Median probe round trip of each link's last round: what sum-mode routes are priced by.",
		q(`hoplink_link_rtt_seconds{from=~"$relay"}`, "{{from}} → {{to}}")))
	l.add(12, panel{Type: "heatmap", Title: "Link round trip, distribution",
		Description: "How the round trips of all links spread over time.",
		Targets:     []target{q(`hoplink_link_rtt_seconds{from=~"$relay"}`, "{{from}} → {{to}}")},
		// The unit in both places: the y axis reads the option, what
		// reads the field (tooltips, the docs picture) the field's.
		FieldConfig: map[string]any{"defaults": map[string]any{"unit": "s"}, "overrides": []any{}},
		Options: map[string]any{"calculate": true, "yAxis": map[string]any{"unit": "s"},
			"color": map[string]any{"scheme": "Oranges", "mode": "scheme"}}})
	l.add(8, timeseries("Link jitter", "s", "Mean variation between successive probe round trips.",
		q(`hoplink_link_jitter_seconds{from=~"$relay"}`, "{{from}} → {{to}}")))
	l.add(8, timeseries("Link loss", "percentunit", "Share of probes lost over the last 10 rounds.",
		q(`hoplink_link_loss_ratio{from=~"$relay"}`, "{{from}} → {{to}}")))
	l.add(8, timeseries("QUIC smoothed RTT", "s", "QUIC's own estimate, on the link's connection.",
		q(`hoplink_link_rtt_smoothed_seconds{from=~"$relay"}`, "{{from}} → {{to}}")))

	l.row("Chains")
	l.add(16, timeseries("Chain latency: estimated vs measured", "s",
		"Estimated: summed link round trips of the current route. Measured: end to end through it. Route changes are annotations.",
		q(`hoplink_chain_latency_seconds{chain=~"$chain"}`, "{{chain}} {{kind}}")))
	l.add(8, panel{Type: "table", Title: "Current routes",
		Description: "The route a chain's new flows take, as its entry relay (the route's first) says; $relay narrows to chains that enter at it.",
		Targets:     []target{{Expr: currentRoutes, Format: "table", Instant: true}}})
	l.add(12, timeseries("Route changes", "short", "Route changes per chain over the last 10 minutes.",
		q(`sum by (chain) (increase(hoplink_chain_route_changes_total{chain=~"$chain"}[10m]))`, "{{chain}}")))
	l.add(12, timeseries("Routing rounds", "ops", "Measurement rounds per second, by result.",
		q(`sum by (chain, result) (rate(hoplink_chain_route_rounds_total{chain=~"$chain"}[$__rate_interval]))`, "{{chain}} {{result}}")))

	l.row("Tunnels")
	// Every relay of a chain counts a flow's bytes; the entry's count once.
	l.add(12, timeseries("Tunnel throughput", "bps", "Payload through each Tunnel, counted at its entry relays, by direction (up = client → target).",
		q(`sum by (tunnel, direction) (rate(hoplink_tunnel_bytes_total{relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval]) and on (relay, tunnel) hoplink_tunnel_flows_total{role="entry", relay=~"$relay", tunnel=~"$tunnel"}) * 8`, "{{tunnel}} {{direction}}")))
	l.add(12, timeseries("Flows", "short", "Flows open now, and started per second, at each Tunnel's entry.",
		q(`sum by (tunnel) (hoplink_tunnel_active_flows{role="entry", relay=~"$relay", tunnel=~"$tunnel"})`, "{{tunnel}} open"),
		q(`sum by (tunnel) (rate(hoplink_tunnel_flows_total{role="entry", relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval]))`, "{{tunnel}} new/s")))
	l.add(12, timeseries("Flow setup latency", "s",
		"Entry: accept to header sent on the first hop. Percentiles over all entry relays.",
		q(`histogram_quantile(0.5, sum by (le, tunnel) (rate(hoplink_flow_setup_seconds_bucket{role="entry", relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval])))`, "{{tunnel}} p50"),
		q(`histogram_quantile(0.9, sum by (le, tunnel) (rate(hoplink_flow_setup_seconds_bucket{role="entry", relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval])))`, "{{tunnel}} p90"),
		q(`histogram_quantile(0.99, sum by (le, tunnel) (rate(hoplink_flow_setup_seconds_bucket{role="entry", relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval])))`, "{{tunnel}} p99")))
	l.add(12, timeseries("Target connect time", "s", "The exit's TCP connect to a routed chain's target.",
		q(`hoplink_target_rtt_seconds{relay=~"$relay", tunnel=~"$tunnel"}`, "{{tunnel}} {{target}}")))
	// A target every flow fails to reach still leaves the relays ready:
	// this is where a dead target shows.
	l.add(8, timeseries("Targets up", "short", "Whether each exit relay's last connect to a Tunnel's target succeeded (1) or failed (0).",
		q(`min by (tunnel, target) (hoplink_target_up{relay=~"$relay", tunnel=~"$tunnel"})`, "{{tunnel}} {{target}}")))
	l.add(8, timeseries("UDP sessions", "short", "UDP sessions open now at each Tunnel's entry.",
		q(`sum by (tunnel) (hoplink_udp_sessions{role="entry", relay=~"$relay", tunnel=~"$tunnel"})`, "{{tunnel}}")))
	// What the chart's HoplinkDatagramsDropped alert fires on, by the
	// same labels, so that the alert has a panel to look at.
	l.add(8, timeseries("UDP datagrams dropped", "pps", "Datagrams relays dropped, by relay, Tunnel and reason (an empty Tunnel: datagrams from peers).",
		q(`sum by (relay, tunnel, reason) (rate(hoplink_udp_dropped_packets_total{relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval]))`, "{{relay}} {{tunnel}} {{reason}}")))

	l.row("Relays")
	l.add(8, timeseries("Relays ready and peers up", "short", "Whether each relay runs and is ready, and how many connections it has to its next hops, in all and by the IP family they run on.",
		q(`max by (relay) (hoplink_relay_ready{relay=~"$relay"})`, "{{relay}} ready"),
		q(`sum by (relay) (hoplink_peer_up{relay=~"$relay"})`, "{{relay}} peers up"),
		q(`sum by (relay, family) (hoplink_peer_family_info{relay=~"$relay"})`, "{{relay}} peers on {{family}}")))
	l.add(8, timeseries("Flow errors", "ops", "Flows that failed, by reason.",
		q(`sum by (relay, reason) (rate(hoplink_flow_errors_total{relay=~"$relay", tunnel=~"$tunnel"}[$__rate_interval]))`, "{{relay}} {{reason}}")))
	// A relay that rejects nothing shows 0, not "no data", so that an
	// empty panel never reads as a broken query.
	l.add(8, timeseries("Streams rejected", "ops", "Streams from peers a relay reset without forwarding, by reason (0: none).",
		q(`sum by (relay, reason) (rate(hoplink_rejected_streams_total{relay=~"$relay"}[$__rate_interval])) or on (relay) max by (relay) (0 * hoplink_relay_ready{relay=~"$relay"})`, "{{relay}} {{reason}}")))
	l.add(8, timeseries("Handshakes", "ops", "Relay-to-relay handshakes, by direction and result.",
		q(`sum by (relay, direction, result) (rate(hoplink_peer_handshakes_total{relay=~"$relay"}[$__rate_interval]))`, "{{relay}} {{direction}} {{result}}")))
	l.add(8, timeseries("Relay memory", "bytes", "Resident memory of each relay process, by relay name (a local mode process runs them all: it shows as one of them).",
		q(`process_resident_memory_bytes + on (instance) group_left (relay) `+relayOfInstance, "{{relay}}")))
	l.add(8, timeseries("Relay CPU", "percentunit", "CPU of each relay process, in cores, by relay name (a local mode process runs them all: it shows as one of them).",
		q(`rate(process_cpu_seconds_total[$__rate_interval]) + on (instance) group_left (relay) `+relayOfInstance, "{{relay}}")))
	l.add(8, timeseries("Certificate expiry", "d", "Days left until the certificate each relay presents expires; the operator renews at a third of its validity left.",
		q(`(min by (relay) (hoplink_certificate_expiry_seconds{relay=~"$relay"}) - time()) / 86400`, "{{relay}}")))
	return l.panels
}

// Variables narrow every panel: each query filters the labels its metrics
// have (relay, or from for links; chain; tunnel) by them, which
// TestQueriesUseTheVariables holds. A Chain's and a Tunnel's label is
// namespace/name, so the namespace narrows the chains and tunnels offered.
// With All, a variable is .*, which also matches a series without the label.
var templateVars = []struct{ name, label, query, regex string }{
	{"namespace", "Namespace", `label_values(hoplink_chain_route_info, chain)`, `/^([^/]+)\//`},
	{"chain", "Chain", `label_values(hoplink_chain_route_info{chain=~"$namespace/.*"}, chain)`, ""},
	{"tunnel", "Tunnel", `label_values(hoplink_tunnel_flows_total{tunnel=~"$namespace/.*"}, tunnel)`, ""},
	{"relay", "Relay", `label_values(hoplink_relay_ready, relay)`, ""},
}

// varOfLabel is the variable that filters a metric's label.
var varOfLabel = map[string]string{"relay": "relay", "from": "relay", "chain": "chain", "tunnel": "tunnel"}

func variables() []map[string]any {
	out := []map[string]any{{
		"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
	}}
	for _, v := range templateVars {
		out = append(out, map[string]any{
			"name": v.name, "label": v.label, "type": "query", "datasource": ds,
			"definition": v.query, "query": map[string]any{"query": v.query, "refId": "Var-" + v.name},
			"regex": v.regex, "refresh": 2, "sort": 1,
			"multi": true, "includeAll": true, "allValue": ".*",
			"current": map[string]any{"selected": true, "text": []string{"All"}, "value": []string{"$__all"}},
		})
	}
	return out
}

// annotations mark route changes on every panel.
func annotations() []map[string]any {
	return []map[string]any{{
		"name":        "Route changes",
		"datasource":  ds,
		"enable":      true,
		"iconColor":   "orange",
		"expr":        `changes(hoplink_chain_route_changes_total{chain=~"$chain"}[1m]) > 0`,
		"step":        "30s",
		"titleFormat": "route changed: {{chain}}",
		"tagKeys":     "chain",
	}}
}

func dashboard() map[string]any {
	return map[string]any{
		"title":         "hoplink",
		"uid":           "hoplink",
		"description":   "Latency per link, chain and tunnel; routes and their changes; relay health.",
		"tags":          []string{"hoplink"},
		"schemaVersion": 39,
		"version":       1,
		"editable":      true,
		"refresh":       "30s",
		"time":          map[string]string{"from": "now-1h", "to": "now"},
		"annotations":   map[string]any{"list": annotations()},
		"templating":    map[string]any{"list": variables()},
		"panels":        panels(),
	}
}

// The network map: a node graph of relays and the links they probe. Grafana
// reads two frames, nodes (id, title, mainstat, color) and edges (id,
// source, target, mainstat, secondarystat, color); a frame with a source
// field is the edges. Labels carry the string fields, set in PromQL; one
// instant table query per number, joined by edge id.

// setLabel sets a label to a fixed value.
func setLabel(expr, label, value string) string {
	return `label_replace(` + expr + `, "` + label + `", "` + value + `", "", "")`
}

// copyLabel copies one label into another.
func copyLabel(expr, dst, src string) string {
	return `label_replace(` + expr + `, "` + dst + `", "$1", "` + src + `", "(.*)")`
}

// relayHealth is 1 for a relay that is ready, 0 for one that is not; a
// relay Prometheus cannot scrape (killed, or outside the $relay filter) is
// what the relays that probe it see: down once no probe answers.
const relayHealth = `(max by (id) (label_replace(hoplink_relay_ready{relay=~"$relay"}, "id", "$1", "relay", "(.*)"))` +
	` or max by (id) (label_replace(hoplink_link_up{from=~"$relay"}, "id", "$1", "to", "(.*)")))`

const (
	linkUp   = `max by (from, to) (hoplink_link_up{from=~"$relay"})`
	linkLoss = `max by (from, to) (hoplink_link_loss_ratio{from=~"$relay"})`
	// lossy is the loss from which a link that answers shows orange.
	lossy = "0.05"
)

func node(cond, state, color string) string {
	return setLabel(setLabel(copyLabel(relayHealth+" "+cond, "title", "id"), "mainstat", state), "color", color)
}

func edge(expr, state, color string) string {
	e := `label_join(` + expr + `, "id", " → ", "from", "to")`
	return setLabel(setLabel(copyLabel(copyLabel(e, "source", "from"), "target", "to"), "detail__state", state), "color", color)
}

// edgeStat is a link metric by edge id, to join to the edges.
func edgeStat(metric string) string {
	return `max by (id) (label_join(` + metric + `{from=~"$relay"}, "id", " → ", "from", "to"))`
}

func networkMap() panel {
	table := func(expr string) target { return target{Expr: expr, Format: "table", Instant: true} }
	byName := func(name string, props ...map[string]any) map[string]any {
		return map[string]any{"matcher": map[string]any{"id": "byName", "options": name}, "properties": props}
	}
	prop := func(id string, v any) map[string]any { return map[string]any{"id": id, "value": v} }
	return panel{Type: "nodegraph", Title: "Network map",
		Description: "Relays and the links they probe. A relay is green when ready, red when not or when no probe reaches it; a link shows its round trip and loss, green when up, orange from 5% loss, red when down.",
		Targets: []target{
			table(node("== 1", "up", "green") + " or " + node("== 0", "down", "red")),
			table(edge(`(`+linkUp+` == 1 unless on (from, to) `+linkLoss+` >= `+lossy+`)`, "up", "green") +
				" or " + edge(`(`+linkUp+` == 1 and on (from, to) `+linkLoss+` >= `+lossy+`)`, "lossy", "orange") +
				" or " + edge(`(`+linkUp+` == 0)`, "down", "red")),
			table(edgeStat("hoplink_link_rtt_seconds")),
			// In percent: the node graph prints an edge's number with
			// its unit's name, not through the unit.
			table("100 * " + edgeStat("hoplink_link_loss_ratio")),
		},
		Transformations: []map[string]any{
			// The edges and their numbers only: the nodes have an id too.
			{"id": "joinByField", "options": map[string]any{"byField": "id", "mode": "outer"},
				"filter": map[string]any{"id": "byRefId", "options": "B|C|D"}},
			{"id": "organize", "options": map[string]any{
				"excludeByName": map[string]bool{"Time": true, "Time 1": true, "Time 2": true, "Time 3": true, "from": true, "to": true},
				"renameByName": map[string]string{"Value #A": "detail__ready", "Value #B": "detail__up",
					"Value #C": "mainstat", "Value #D": "secondarystat"},
			}},
		},
		FieldConfig: map[string]any{"defaults": map[string]any{}, "overrides": []any{
			byName("mainstat", prop("unit", "s"), prop("decimals", 3)),
			byName("secondarystat", prop("unit", "%"), prop("decimals", 1)),
		}},
	}
}
