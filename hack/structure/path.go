package main

import (
	"fmt"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/callgraph/vta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

// A leg is one thing a flow must do at one relay, from the function where
// it starts to the one that does it. Only the ends are written here: the
// functions between them are found in the call graph, so a function put
// in between, moved or renamed shows up in the count without an edit.
type leg struct {
	Relay    string
	From, To string // "relay/quic.Endpoint.accept": package relative to the module, or a standard one ("net.Dialer.DialContext")
	// Via, where the code chooses by a value the call graph cannot see
	// (the header's kind, a chain's transport), is the function the
	// flow's choice takes.
	Via  string
	What string
}

// tcpLegs is one TCP flow over a three-relay chain (hk -> seattle -> la)
// on QUIC hops under transport auto, client socket to target socket,
// leg by leg as docs/architecture.md's "A flow, hop by hop" walks it.
var tcpLegs = []leg{
	{"entry", "relay.Relay.openTunnel", "relay.tcpFlows.serve", "", "the Tunnel's listener accepts its clients"},
	{"entry", "relay.tcpFlows.serve", "relay.tcpFlows.entry", "", "a client's flow starts"},
	{"entry", "relay.tcpFlows.entry", "relay.routeBook.Route", "", "the route"},
	{"entry", "relay.tcpFlows.entry", "relay/quic.Link.OpenStream", openStream, "a QUIC stream to the next hop"},
	{"entry", openStream, "relay/hop.Header.Append", "", "the header written"},
	{"entry", "relay.tcpFlows.entry", "relay/flow.Join", "", "client and stream joined"},
	{"entry", "relay/flow.Join", "relay/flow.StreamEnd.Write", "", "the client's bytes onto the stream"},
	{"middle", "relay/quic.Endpoint.accept", "relay/hop.Read", "", "the stream accepted, its header read"},
	{"middle", "relay/quic.Endpoint.accept", "relay.dispatcher.Serve", "", "the hop handed up"},
	{"middle", "relay.dispatcher.Serve", "relay/admit.Stream", "", "the hop admitted"},
	{"middle", "relay.dispatcher.Serve", "relay.tcpFlows.middle", "", "the flow passed on"},
	{"middle", "relay.tcpFlows.middle", "relay/quic.Link.OpenStream", openStream, "a QUIC stream to the next hop"},
	{"middle", "relay.tcpFlows.middle", "relay/flow.Join", "", "the two streams joined"},
	{"exit", "relay.dispatcher.Serve", "relay.tcpFlows.exit", "", "the flow to its target"},
	{"exit", "relay.tcpFlows.exit", "net.Dialer.DialContext", "", "the target dialed"},
	{"exit", "relay.tcpFlows.exit", "relay/flow.Join", "", "target and stream joined"},
	{"exit", "relay/flow.Join", "relay/flow.TCPEnd.Write", "", "the stream's bytes to the target"},
}

// openStream is where Hops.Open takes a TCP flow on a QUIC hop (not a
// UDP session's, a TLS hop or a link request's).
const openStream = "relay/nexthop.Hops.openStream"

// call is a step of a derived path: a function of the module and the file
// that declares it.
type call struct {
	Func, File string
}

// walked is a leg and the calls that make it, From first.
type walked struct {
	leg
	Calls []call
}

// callGraph is the module's functions under a tree and what each calls,
// by variable type analysis over SSA: interface calls and function values
// go only where a value of that type or function can reach, so a callback
// is not taken for every function of its signature. Closures count as the
// function that declares them.
type callGraph struct {
	calls map[string][]string // caller -> callees, each once, in a stable order
	files map[string]string   // the module's functions -> file, relative to the module
}

func (t *tree) callGraph(under string) (*callGraph, error) {
	cfg := &packages.Config{Dir: t.root, Mode: packages.LoadSyntax | packages.NeedDeps | packages.NeedImports}
	pkgs, err := packages.Load(cfg, "./"+under+"/...")
	if err != nil {
		return nil, err
	}
	if n := packages.PrintErrors(pkgs); n > 0 {
		return nil, fmt.Errorf("%d errors loading ./%s/...", n, under)
	}
	prog, _ := ssautil.Packages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	funcs := allFunctions(prog)
	cg := vta.CallGraph(funcs, cha.CallGraph(prog))
	g := &callGraph{calls: map[string][]string{}, files: map[string]string{}}
	seen := map[[2]string]bool{}
	callgraph.GraphVisitEdges(cg, func(e *callgraph.Edge) error {
		from, to := t.funcName(e.Caller.Func), t.funcName(e.Callee.Func)
		if from == "" || to == "" || from == to || seen[[2]string{from, to}] {
			return nil
		}
		seen[[2]string{from, to}] = true
		g.calls[from] = append(g.calls[from], to)
		return nil
	})
	for f := range funcs {
		if f.Parent() != nil || f.Synthetic != "" || f.Pkg == nil || !f.Pos().IsValid() {
			continue
		}
		if _, ours := t.rel(f.Pkg.Pkg.Path()); ours {
			g.files[t.funcName(f)] = t.whereFile(prog.Fset.Position(f.Pos()).Filename)
		}
	}
	for _, cs := range g.calls {
		slices.Sort(cs)
	}
	return g, nil
}

// allFunctions is every function of the program, and the methods of every
// named type of its packages whether or not something calls them: a leg
// may start at a method that only the network makes run.
func allFunctions(prog *ssa.Program) map[*ssa.Function]bool {
	funcs := ssautil.AllFunctions(prog)
	for _, p := range prog.AllPackages() {
		for _, m := range p.Members {
			tm, ok := m.(*ssa.Type)
			if !ok {
				continue
			}
			for _, t := range []types.Type{tm.Type(), types.NewPointer(tm.Type())} {
				ms := prog.MethodSets.MethodSet(t)
				for i := range ms.Len() {
					if f := prog.MethodValue(ms.At(i)); f != nil {
						withClosures(funcs, f)
					}
				}
			}
		}
	}
	return funcs
}

func withClosures(funcs map[*ssa.Function]bool, f *ssa.Function) {
	funcs[f] = true
	for _, c := range f.AnonFuncs {
		withClosures(funcs, c)
	}
}

// funcName names a function as legs do: its package relative to the
// module (or in full, if not the module's), its receiver's type, its
// name. A closure is named for the function that declares it; a wrapper
// ssa made has no name (a function of a package loaded without its
// source, which ssa marks synthetic too, has).
func (t *tree) funcName(f *ssa.Function) string {
	if f == nil {
		return ""
	}
	for f.Parent() != nil {
		f = f.Parent()
	}
	if f.Synthetic != "" && f.Origin() == nil && f.Synthetic != "from type information" {
		return ""
	}
	if o := f.Origin(); o != nil {
		f = o
	}
	var pkg *types.Package
	switch {
	case f.Pkg != nil:
		pkg = f.Pkg.Pkg
	case f.Object() != nil:
		pkg = f.Object().Pkg()
	}
	if pkg == nil {
		return ""
	}
	path := pkg.Path()
	if rel, ok := t.rel(path); ok {
		path = rel
	}
	if r := f.Signature.Recv(); r != nil {
		rt := r.Type()
		if p, ok := rt.(*types.Pointer); ok {
			rt = p.Elem()
		}
		if n, ok := rt.(*types.Named); ok {
			return path + "." + n.Obj().Name() + "." + f.Name()
		}
		return ""
	}
	return path + "." + f.Name()
}

// walk finds each leg's shortest chain of calls through the module's
// functions. A leg whose end cannot be reached from its start is an error:
// the code no longer does that step that way, and the legs need a look.
func (g *callGraph) walk(legs []leg) ([]walked, error) {
	var out []walked
	var broken []string
	for _, l := range legs {
		if _, ok := g.files[l.From]; !ok {
			broken = append(broken, fmt.Sprintf("%s: no function %s", l.What, l.From))
			continue
		}
		chain := g.shortest(l.From, l.To)
		if l.Via != "" {
			chain = nil
			if a, b := g.shortest(l.From, l.Via), g.shortest(l.Via, l.To); a != nil && b != nil {
				chain = append(a, b[1:]...)
			}
		}
		if chain == nil {
			via := ""
			if l.Via != "" {
				via = " through " + l.Via
			}
			broken = append(broken, fmt.Sprintf("%s: %s does not reach %s%s", l.What, l.From, l.To, via))
			continue
		}
		w := walked{leg: l}
		for _, f := range chain {
			if file, ours := g.files[f]; ours {
				w.Calls = append(w.Calls, call{f, file})
			}
		}
		out = append(out, w)
	}
	if len(broken) > 0 {
		return out, fmt.Errorf("the TCP flow's legs no longer match the code (update tcpLegs in hack/structure):\n  %s", strings.Join(broken, "\n  "))
	}
	return out, nil
}

// shortest is a breadth-first search from one function to another that
// passes only through the module's functions.
func (g *callGraph) shortest(from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		if f == to {
			var chain []string
			for ; f != ""; f = prev[f] {
				chain = append(chain, f)
			}
			slices.Reverse(chain)
			return chain
		}
		if _, ours := g.files[f]; !ours {
			continue
		}
		for _, c := range g.calls[f] {
			if _, ok := prev[c]; !ok {
				prev[c] = f
				queue = append(queue, c)
			}
		}
	}
	return nil
}

// crossed counts the distinct functions and files of walked legs.
func crossed(ws []walked) (funcs, files int) {
	fs, fl := map[string]bool{}, map[string]bool{}
	for _, w := range ws {
		for _, c := range w.Calls {
			fs[c.Func], fl[c.File] = true, true
		}
	}
	return len(fs), len(fl)
}
