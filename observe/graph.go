package observe

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Colours of the map: what works, what is stopping on purpose, what failed.
const (
	colourUp       = "forestgreen"
	colourDraining = "orange"
	colourDown     = "red"
)

// WriteGraph draws r as a Graphviz DOT graph, a map of the network: a
// node per relay (green: ready; orange: draining or not ready; red: no
// answer), an edge per link a relay reports to its next hops, labelled
// with its round trip and loss and coloured by its state, drawn bold where
// a chain's current route takes it (the chains in its tooltip). Links of
// a relay that does not answer are unknown, and not drawn; its peers'
// links to it are. `dot -Tsvg` renders it.
func WriteGraph(w io.Writer, r *Report) error {
	var b strings.Builder
	b.WriteString("digraph hoplink {\n  rankdir=LR;\n  node [shape=box, style=rounded];\n")
	routes := map[[2]string][]string{} // link -> chains whose route takes it
	for _, s := range r.answers() {
		for _, c := range s.Chains {
			for i := 0; i+1 < len(c.Route); i++ {
				k := [2]string{c.Route[i], c.Route[i+1]}
				routes[k] = append(routes[k], c.Chain)
			}
		}
	}
	for _, rl := range r.Relays {
		colour, state := colourUp, "ready"
		switch s := rl.Status; {
		case s == nil:
			colour, state = colourDown, "no answer: "+rl.Err
		case s.Draining:
			colour, state = colourDraining, "draining"
		case !s.Ready:
			colour, state = colourDraining, "not ready"
		}
		fmt.Fprintf(&b, "  %s [color=%s, fontcolor=%s, tooltip=%s];\n", quote(rl.Name), colour, colour, quote(rl.Name+": "+state))
	}
	for _, rl := range r.Relays {
		if rl.Status == nil {
			continue
		}
		for _, p := range rl.Status.Peers {
			colour, label := colourUp, fmt.Sprintf("%s %.1f%%", dur(p.RTT), 100*min(p.Loss, 1))
			switch {
			case p.Draining:
				colour, label = colourDraining, "draining"
			case !p.Up:
				colour, label = colourDown, "down"
			}
			attrs := []string{"color=" + colour, "fontcolor=" + colour, "label=" + quote(label)}
			if chains := routes[[2]string{rl.Name, p.Name}]; len(chains) > 0 {
				slices.Sort(chains)
				attrs = append(attrs, "penwidth=2.5", "tooltip="+quote("routes of "+strings.Join(slices.Compact(chains), ", ")))
			}
			fmt.Fprintf(&b, "  %s -> %s [%s];\n", quote(rl.Name), quote(p.Name), strings.Join(attrs, ", "))
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// quote is a DOT string: Go's quoting escapes what DOT needs (quotes and
// backslashes) and keeps the text printable.
func quote(s string) string { return strconv.Quote(s) }
