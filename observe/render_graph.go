package observe

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/goccy/go-graphviz"
)

// GraphFormats are what RenderGraph writes: the DOT text itself, or a
// picture laid out by Graphviz (built into the binary, no dot needed).
// Not PNG: the library draws PNG with a renderer of its own that leaves
// out the relays' boxes; an SVG converts to any picture.
var GraphFormats = []string{"dot", "svg"}

// RenderGraph writes r's map (WriteGraph) in format.
func RenderGraph(ctx context.Context, w io.Writer, r *Report, format string) error {
	var dot bytes.Buffer
	if err := WriteGraph(&dot, r); err != nil {
		return err
	}
	var f graphviz.Format
	switch format {
	case "dot":
		_, err := w.Write(dot.Bytes())
		return err
	case "svg":
		f = graphviz.SVG
	default:
		return fmt.Errorf("no map format %q: choose one of %v", format, GraphFormats)
	}
	gv, err := graphviz.New(ctx)
	if err != nil {
		return fmt.Errorf("graphviz: %w", err)
	}
	defer gv.Close()
	g, err := graphviz.ParseBytes(dot.Bytes())
	if err != nil {
		return fmt.Errorf("the map's DOT: %w", err)
	}
	defer g.Close()
	return gv.Render(ctx, g, f, w)
}
