package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// frame is a table as Grafana makes of a table-format instant query: a
// column per label and "Value #<refId>".
type frame struct {
	refID string
	rows  []map[string]string
}

// mapFrames evaluates the network map's queries and applies its
// transformations as Grafana would (the two it uses), returning the nodes
// frame and the edges frame: the one with a source field.
func mapFrames(t *testing.T, promAddr string) (nodes, edges []map[string]string, err error) {
	t.Helper()
	b, _ := os.ReadFile(committed)
	var d struct {
		Panels []struct {
			Type    string `json:"type"`
			Targets []struct {
				Expr, RefID, Format string
				Instant             bool
			} `json:"targets"`
			Transformations []struct {
				ID      string          `json:"id"`
				Options json.RawMessage `json:"options"`
				Filter  *struct {
					ID, Options string
				} `json:"filter"`
			} `json:"transformations"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var frames []frame
	found := false
	for _, p := range d.Panels {
		if p.Type != "nodegraph" {
			continue
		}
		found = true
		for _, tg := range p.Targets {
			if tg.Format != "table" || !tg.Instant {
				t.Fatalf("map query %s: format %q instant %v, want an instant table", tg.RefID, tg.Format, tg.Instant)
			}
			rows, err := promRows(promAddr, atAll.Replace(tg.Expr))
			if err != nil {
				return nil, nil, fmt.Errorf("query %s: %v", tg.RefID, err)
			}
			for _, r := range rows {
				r["Time"] = "now"
				r["Value #"+tg.RefID] = r[""]
				delete(r, "")
				delete(r, "__name__")
			}
			frames = append(frames, frame{tg.RefID, rows})
		}
		for _, tr := range p.Transformations {
			switch tr.ID {
			case "joinByField":
				var o struct{ ByField, Mode string }
				json.Unmarshal(tr.Options, &o)
				if tr.Filter == nil || tr.Filter.ID != "byRefId" || o.Mode != "outer" {
					t.Fatalf("join %+v: want an outer join of frames picked by refId", tr)
				}
				in := map[string]bool{}
				for _, r := range strings.Split(tr.Filter.Options, "|") {
					in[r] = true
				}
				joined, byKey := frame{refID: "joined"}, map[string]map[string]string{}
				var rest []frame
				for _, f := range frames {
					if !in[f.refID] {
						rest = append(rest, f)
						continue
					}
					for _, r := range f.rows {
						j := byKey[r[o.ByField]]
						if j == nil {
							j = map[string]string{}
							byKey[r[o.ByField]] = j
							joined.rows = append(joined.rows, j)
						}
						for k, v := range r {
							if _, dup := j[k]; dup && k != o.ByField && k != "Time" { // Grafana numbers the times: organize drops them
								t.Errorf("join: field %s in two frames", k)
							}
							j[k] = v
						}
					}
				}
				frames = append(rest, joined)
			case "organize":
				var o struct {
					ExcludeByName map[string]bool
					RenameByName  map[string]string
				}
				json.Unmarshal(tr.Options, &o)
				for _, f := range frames {
					for _, r := range f.rows {
						for k, v := range r {
							if o.ExcludeByName[k] {
								delete(r, k)
							} else if n, ok := o.RenameByName[k]; ok {
								delete(r, k)
								r[n] = v
							}
						}
					}
				}
			default:
				t.Fatalf("transformation %s: the test does not know what it does", tr.ID)
			}
		}
	}
	if !found {
		t.Fatal("no node graph panel")
	}
	if len(frames) != 2 {
		return nil, nil, fmt.Errorf("%d frames, want nodes and edges", len(frames))
	}
	for _, f := range frames {
		if len(f.rows) > 0 && f.rows[0]["source"] != "" {
			edges = f.rows
		} else {
			nodes = f.rows
		}
	}
	return nodes, edges, nil
}

// The network map shows every relay and every link of a running network
// with the fields Grafana's node graph reads, and a killed relay down
// within a probe interval (plus a scrape).
func TestNetworkMap(t *testing.T) {
	s := startStandalone(t)
	s.wait(t, 30*time.Second, `hoplink_link_up{from="seattle",to="la"} == 1`)
	relays := []string{"hk", "seattle", "la"}
	links := [][2]string{{"hk", "seattle"}, {"hk", "la"}, {"seattle", "la"}}

	check := func(nodes, edges []map[string]string, down string) error {
		ids := map[string]map[string]string{}
		for _, n := range nodes {
			for _, f := range []string{"id", "title", "mainstat", "color"} {
				if n[f] == "" {
					return fmt.Errorf("node %v has no %s", n, f)
				}
			}
			ids[n["id"]] = n
		}
		for _, r := range relays {
			n, ok := ids[r]
			want := "up"
			if r == down {
				want = "down"
			}
			if !ok || n["mainstat"] != want {
				return fmt.Errorf("relay %s: node %v, want %s (nodes %v)", r, n, want, nodes)
			}
		}
		byLink := map[[2]string]map[string]string{}
		for _, e := range edges {
			for _, f := range []string{"id", "source", "target", "color", "detail__state"} {
				if e[f] == "" {
					return fmt.Errorf("edge %v has no %s", e, f)
				}
			}
			// Grafana fails the panel on an edge whose end is no node.
			if ids[e["source"]] == nil || ids[e["target"]] == nil {
				return fmt.Errorf("edge %v: an end is no node", e)
			}
			byLink[[2]string{e["source"], e["target"]}] = e
		}
		for _, l := range links {
			if l[0] == down {
				continue // what it measured went with it
			}
			e, ok := byLink[l]
			want := "up"
			if l[1] == down {
				want = "down"
			}
			if !ok || e["detail__state"] != want {
				return fmt.Errorf("link %s → %s: edge %v, want %s (edges %v)", l[0], l[1], e, want, edges)
			}
			if want == "up" {
				for _, f := range []string{"mainstat", "secondarystat"} {
					if _, err := strconv.ParseFloat(e[f], 64); err != nil {
						return fmt.Errorf("link %s → %s: %s %q is no number", l[0], l[1], f, e[f])
					}
				}
			}
		}
		return nil
	}
	waitFor(t, 30*time.Second, "every relay and link up on the map", func() error {
		nodes, edges, err := mapFrames(t, s.promAddr)
		if err != nil {
			return err
		}
		return check(nodes, edges, "")
	})

	s.relays["seattle"].Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	// A probe round that nothing answers ends within an interval; the
	// scrape after it, a scrape interval (1 s) later at most.
	within := probeInterval + 2*time.Second
	waitFor(t, within+5*time.Second, "seattle down on the map", func() error {
		nodes, edges, err := mapFrames(t, s.promAddr)
		if err != nil {
			return err
		}
		return check(nodes, edges, "seattle")
	})
	took := time.Since(killed)
	t.Logf("the map showed seattle down %v after the kill", took.Round(100*time.Millisecond))
	if took > within {
		t.Errorf("the map showed seattle down %v after the kill, want within %v", took.Round(100*time.Millisecond), within)
	}
}
