package relay

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// TestEverySessionNamesItsTunnel: a datagram channel's queue serves
// Tunnels in turn by the Share a session names; a session opened without
// one joins a single anonymous group, so every tun and echo session of
// every Tunnel on the link would share one Tunnel's turn.
func TestEverySessionNamesItsTunnel(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	sessions := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Session" || len(call.Args) != 1 {
				return true
			}
			lit, ok := call.Args[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			if typ, ok := lit.Type.(*ast.SelectorExpr); !ok || typ.Sel.Name != "SessionOptions" {
				return true
			}
			sessions++
			for _, e := range lit.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Share" {
						return true
					}
				}
			}
			t.Errorf("%s: a session opened without a Share joins no Tunnel's turn in a datagram channel's queue", fset.Position(call.Pos()))
			return true
		})
	}
	if sessions < 5 {
		t.Fatalf("found %d sessions opened in package relay: the test no longer sees them", sessions)
	}
}
