package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// dumpRanges writes, for the dashboard picture in docs (hack/dashboards/
// picture.py draws it), every panel's series over [from, to] as Prometheus
// answers them, and the annotation's times.
func dumpRanges(t *testing.T, promAddr string, dashboard []byte, from, to time.Time, out string) {
	var d struct {
		Panels []struct {
			Type        string          `json:"type"`
			Title       string          `json:"title"`
			GridPos     json.RawMessage `json:"gridPos"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
		Annotations struct {
			List []struct {
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		t.Fatal(err)
	}
	type series struct {
		Legend string       `json:"legend"`
		Points [][2]float64 `json:"points"`
	}
	type panel struct {
		Type    string          `json:"type"`
		Title   string          `json:"title"`
		GridPos json.RawMessage `json:"gridPos"`
		Unit    string          `json:"unit"`
		Series  []series        `json:"series"`
	}
	dump := struct {
		From, To    float64
		Panels      []panel   `json:"panels"`
		Annotations []float64 `json:"annotations"`
	}{From: float64(from.Unix()), To: float64(to.Unix())}
	rangeQuery := func(expr string) ([]struct {
		Metric map[string]string `json:"metric"`
		Values [][2]any          `json:"values"`
	}, error) {
		q := url.Values{"query": {atAll.Replace(expr)},
			"start": {fmt.Sprint(from.Unix())}, "end": {fmt.Sprint(to.Unix())}, "step": {"2"}}
		r, err := http.Get("http://" + promAddr + "/api/v1/query_range?" + q.Encode())
		if err != nil {
			return nil, err
		}
		defer r.Body.Close()
		var res struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Values [][2]any          `json:"values"`
				} `json:"result"`
			} `json:"data"`
		}
		err = json.NewDecoder(r.Body).Decode(&res)
		return res.Data.Result, err
	}
	points := func(vs [][2]any) [][2]float64 {
		var out [][2]float64
		for _, v := range vs {
			ts, _ := v[0].(float64)
			var f float64
			fmt.Sscan(fmt.Sprint(v[1]), &f)
			out = append(out, [2]float64{ts, f})
		}
		return out
	}
	for _, p := range d.Panels {
		pn := panel{Type: p.Type, Title: p.Title, GridPos: p.GridPos, Unit: p.FieldConfig.Defaults.Unit}
		for _, tg := range p.Targets {
			res, err := rangeQuery(tg.Expr)
			if err != nil {
				t.Fatalf("%s: %v", p.Title, err)
			}
			for _, s := range res {
				legend := tg.LegendFormat
				for k, v := range s.Metric {
					legend = strings.ReplaceAll(legend, "{{"+k+"}}", v)
				}
				if legend == "" {
					legend = s.Metric["route"] + " " + s.Metric["chain"]
				}
				pn.Series = append(pn.Series, series{Legend: legend, Points: points(s.Values)})
			}
		}
		dump.Panels = append(dump.Panels, pn)
	}
	for _, a := range d.Annotations.List {
		res, err := rangeQuery(a.Expr)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res {
			for _, p := range points(s.Values) {
				dump.Annotations = append(dump.Annotations, p[0])
			}
		}
	}
	b, err := json.Marshal(dump)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d panels", out, len(dump.Panels))
}
