// Command structure prints the counts that say how the code is put
// together, which docs quote and issue 30 bounds:
//
//   - methods on one type in the module, relay/... and route/... (at most 20), the ten
//     most in each tree;
//   - exported func-typed fields of exported structs in relay/... (at most
//     8 in all), each listed;
//   - imports of hack/ from outside it, tests included (none), each listed;
//   - the functions a TCP flow passes through from the client's socket to
//     the target's, with their files, counted: the call graph's shortest
//     chains between the ends of each leg of docs/architecture.md's "A
//     flow, hop by hop".
//
// Run from anywhere in the module:
//
//	go run ./hack/structure
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// The bounds issue 30 sets; the output marks a count past its bound.
const (
	maxMethods   = 20
	maxCallbacks = 8
	maxHack      = 0
)

func main() {
	dir := flag.String("C", ".", "a directory of the module")
	flag.Parse()
	t, err := load(*dir)
	if err == nil {
		err = report(os.Stdout, t)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(1)
	}
}

// pkg is what go list says of a package, and its files once parsed.
type pkg struct {
	ImportPath, Name, Dir              string
	GoFiles, CgoFiles                  []string
	TestGoFiles, XTestGoFiles          []string
	Imports, TestImports, XTestImports []string
	DepOnly                            bool

	files []*ast.File // GoFiles and CgoFiles, parsed on first use
}

// tree is the module's packages and everything they import.
type tree struct {
	module, root string
	fset         *token.FileSet
	pkgs         map[string]*pkg
}

// load lists the module's packages (e2e's included) and their
// dependencies, as built here.
func load(dir string) (*tree, error) {
	out, err := goCmd(dir, "list", "-m", "-f", "{{.Path}} {{.Dir}}")
	if err != nil {
		return nil, err
	}
	module, root, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	out, err = goCmd(root, "list", "-e", "-deps", "-tags", "e2e", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,Imports,TestImports,XTestImports,DepOnly", "./...")
	if err != nil {
		return nil, err
	}
	t := &tree{module: module, root: root, fset: token.NewFileSet(), pkgs: map[string]*pkg{}}
	for d := json.NewDecoder(bytes.NewReader(out)); ; {
		p := &pkg{}
		if err := d.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		t.pkgs[p.ImportPath] = p
	}
	return t, nil
}

func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// ours returns the module's packages (not what they only depend on) under
// under, a path relative to the module ("relay"), in order.
func (t *tree) ours(under string) []*pkg {
	var out []*pkg
	for path, p := range t.pkgs {
		rel, ok := t.rel(path)
		if ok && !p.DepOnly && (under == "" || rel == under || strings.HasPrefix(rel, under+"/")) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *pkg) int { return strings.Compare(a.ImportPath, b.ImportPath) })
	return out
}

// rel is an import path relative to the module, if it is the module's.
func (t *tree) rel(path string) (string, bool) {
	if path == t.module {
		return ".", true
	}
	return strings.CutPrefix(path, t.module+"/")
}

func (t *tree) parsed(p *pkg) ([]*ast.File, error) {
	if p.files != nil {
		return p.files, nil
	}
	for _, name := range slices.Concat(p.GoFiles, p.CgoFiles) {
		f, err := parser.ParseFile(t.fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		p.files = append(p.files, f)
	}
	return p.files, nil
}

// whereFile is a file's path relative to the module root.
func (t *tree) whereFile(name string) string {
	if r, err := filepath.Rel(t.root, name); err == nil {
		return r
	}
	return name
}

// where is a position as a path relative to the module root.
func (t *tree) where(pos token.Pos) string {
	p := t.fset.Position(pos)
	if r, err := filepath.Rel(t.root, p.Filename); err == nil {
		return r
	}
	return p.Filename
}

// typeCount is the methods declared on one type (value and pointer
// receivers together).
type typeCount struct {
	Type    string // "relay/nexthop.Peers"
	Methods int
}

func (t *tree) methods(under string) ([]typeCount, error) {
	n := map[string]int{}
	for _, p := range t.ours(under) {
		files, err := t.parsed(p)
		if err != nil {
			return nil, err
		}
		rel, _ := t.rel(p.ImportPath)
		for _, f := range files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && len(fd.Recv.List) == 1 {
					n[rel+"."+recvName(fd.Recv.List[0].Type)]++
				}
			}
		}
	}
	var out []typeCount
	for typ, c := range n {
		out = append(out, typeCount{typ, c})
	}
	slices.SortFunc(out, func(a, b typeCount) int {
		if a.Methods != b.Methods {
			return b.Methods - a.Methods
		}
		return strings.Compare(a.Type, b.Type)
	})
	return out, nil
}

// recvName is the type a receiver names: T for *T, T[K] and T.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return types.ExprString(e)
		}
	}
}

// field is an exported func-typed field of an exported struct.
type field struct {
	Name string // "relay/quic.Options.Handler"
	Type string // as written
	Pos  string
}

// callbacks lists the exported func-typed fields of the exported structs
// of the packages under it: a field whose type is a func, or a named
// type (of any package) that is one.
func (t *tree) callbacks(under string) ([]field, error) {
	var out []field
	for _, p := range t.ours(under) {
		files, err := t.parsed(p)
		if err != nil {
			return nil, err
		}
		rel, _ := t.rel(p.ImportPath)
		for _, f := range files {
			for _, d := range f.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, s := range gd.Specs {
					ts := s.(*ast.TypeSpec)
					if st, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() {
						out = append(out, t.funcFields(p, f, rel+"."+ts.Name.Name, st)...)
					}
				}
			}
		}
	}
	return out, nil
}

// funcFields walks st's exported fields, into struct-typed ones.
func (t *tree) funcFields(p *pkg, f *ast.File, prefix string, st *ast.StructType) []field {
	var out []field
	for _, fl := range st.Fields.List {
		for _, name := range fl.Names {
			if !name.IsExported() {
				continue
			}
			if inner, ok := fl.Type.(*ast.StructType); ok {
				out = append(out, t.funcFields(p, f, prefix+"."+name.Name, inner)...)
				continue
			}
			if t.isFunc(p, f, fl.Type, 0) {
				out = append(out, field{prefix + "." + name.Name, types.ExprString(fl.Type), t.where(name.Pos())})
			}
		}
	}
	return out
}

// isFunc says whether e, written in file f of package p, is a func type,
// following named types across packages.
func (t *tree) isFunc(p *pkg, f *ast.File, e ast.Expr, depth int) bool {
	if depth > 16 {
		return false
	}
	switch x := e.(type) {
	case *ast.FuncType:
		return true
	case *ast.ParenExpr:
		return t.isFunc(p, f, x.X, depth+1)
	case *ast.IndexExpr:
		return t.isFunc(p, f, x.X, depth+1)
	case *ast.IndexListExpr:
		return t.isFunc(p, f, x.X, depth+1)
	case *ast.Ident:
		if q, g, ts := t.typeSpec(p, x.Name); ts != nil {
			return t.isFunc(q, g, ts.Type, depth+1)
		}
	case *ast.SelectorExpr:
		id, ok := x.X.(*ast.Ident)
		if !ok {
			return false
		}
		if q := t.imported(f, id.Name); q != nil {
			if r, g, ts := t.typeSpec(q, x.Sel.Name); ts != nil {
				return t.isFunc(r, g, ts.Type, depth+1)
			}
		}
	}
	return false
}

// typeSpec finds the declaration of type name in package p.
func (t *tree) typeSpec(p *pkg, name string) (*pkg, *ast.File, *ast.TypeSpec) {
	files, err := t.parsed(p)
	if err != nil {
		return nil, nil, nil
	}
	for _, f := range files {
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, s := range gd.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.Name == name {
						return p, f, ts
					}
				}
			}
		}
	}
	return nil, nil, nil
}

// imported is the package that name refers to in file f.
func (t *tree) imported(f *ast.File, name string) *pkg {
	for _, is := range f.Imports {
		path := strings.Trim(is.Path.Value, `"`)
		q := t.pkgs[path]
		if q == nil {
			continue
		}
		if (is.Name != nil && is.Name.Name == name) || (is.Name == nil && q.Name == name) {
			return q
		}
	}
	return nil
}

// hackImport is an import of a package under hack/ from outside it.
type hackImport struct {
	File, Imports string
}

func (t *tree) hackImports() ([]hackImport, error) {
	var out []hackImport
	for _, p := range t.ours("") {
		rel, _ := t.rel(p.ImportPath)
		if rel == "hack" || strings.HasPrefix(rel, "hack/") {
			continue
		}
		if !slices.ContainsFunc(slices.Concat(p.Imports, p.TestImports, p.XTestImports), t.inHack) {
			continue
		}
		for _, name := range slices.Concat(p.GoFiles, p.CgoFiles, p.TestGoFiles, p.XTestGoFiles) {
			f, err := parser.ParseFile(t.fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			for _, is := range f.Imports {
				if path := strings.Trim(is.Path.Value, `"`); t.inHack(path) {
					rel, _ := t.rel(path)
					out = append(out, hackImport{t.where(f.Package), rel})
				}
			}
		}
	}
	return out, nil
}

func (t *tree) inHack(path string) bool {
	rel, ok := t.rel(path)
	return ok && (rel == "hack" || strings.HasPrefix(rel, "hack/"))
}

func report(w io.Writer, t *tree) error {
	for _, under := range []string{"", "relay", "route"} {
		ms, err := t.methods(under)
		if err != nil {
			return err
		}
		most := 0
		if len(ms) > 0 {
			most = ms[0].Methods
		}
		where := under + "/..."
		if under == "" {
			where = "the module"
		}
		fmt.Fprintf(w, "Most methods on one type in %s: %d (bound %d)\n", where, most, maxMethods)
		for _, m := range ms[:min(10, len(ms))] {
			fmt.Fprintf(w, "  %3d  %s%s\n", m.Methods, m.Type, over(m.Methods, maxMethods))
		}
		fmt.Fprintln(w)
	}

	cbs, err := t.callbacks("relay")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Exported callback fields of exported structs in relay/...: %d (bound %d)%s\n", len(cbs), maxCallbacks, over(len(cbs), maxCallbacks))
	for _, c := range cbs {
		fmt.Fprintf(w, "  %s  %s  (%s)\n", c.Name, c.Type, c.Pos)
	}
	fmt.Fprintln(w)

	his, err := t.hackImports()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Imports of hack/ from outside it, tests included: %d (bound %d)%s\n", len(his), maxHack, over(len(his), maxHack))
	for _, h := range his {
		fmt.Fprintf(w, "  %s imports %s\n", h.File, h.Imports)
	}
	fmt.Fprintln(w)

	pairs, err := t.nearCopies()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Pairs of functions in the code that ships sharing %d lines or more but for names and values: %d (bound %d)%s\n",
		minLines, len(pairs), maxNearCopy, over(len(pairs), maxNearCopy))
	for _, p := range pairs {
		why := whyKept[p.A+" ~ "+p.B]
		if why == "" {
			why = "no reason given (whyKept in hack/structure)"
		}
		fmt.Fprintf(w, "  %s ~ %s  (%d lines): %s\n", p.A, p.B, p.Lines, why)
	}
	fmt.Fprintln(w)

	g, err := t.callGraph("relay")
	if err != nil {
		return err
	}
	legs, err := g.walk(tcpLegs)
	if err != nil {
		return err
	}
	funcs, files := crossed(legs)
	fmt.Fprintf(w, "Files a TCP flow crosses from client socket to target socket (hk -> seattle -> la, QUIC hops, transport auto): %d files, %d functions, the calls between each leg's ends found in the call graph\n", files, funcs)
	for _, l := range legs {
		fmt.Fprintf(w, "  %s: %s\n", l.Relay, l.What)
		for _, c := range l.Calls {
			fmt.Fprintf(w, "    %-28s %s\n", c.File, c.Func)
		}
	}
	return nil
}

func over(n, bound int) string {
	if n > bound {
		return "  over the bound"
	}
	return ""
}
