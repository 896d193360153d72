package main

import (
	"go/ast"
	"go/scanner"
	"go/token"
	"hash/fnv"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Near-copies: places in two functions of the code that ships that run
// the same for minLines lines or more but for names and values. Each line
// is folded to its tokens' kinds (identifiers and literals alike); lines
// of punctuation alone are passed over; a run of lines that stands in more
// than maxPlaces places is a shape of the language (error checks), not a
// copy.
const (
	minLines    = 8
	maxPlaces   = 8
	maxNearCopy = 2 // issue 38's bound, each pair left with a reason
)

// copyPair is two functions that share a run of lines.
type copyPair struct {
	A, B  string // "relay/x.go recv.Name"
	Lines int    // the longest run they share
}

// whyKept says why a pair of near-copies stays, by "A ~ B".
var whyKept = map[string]string{
	"cmd/hoplink/forward.go newForwardCmd ~ cmd/hoplink/run.go newRelayCmd": "two commands' runs of error checks after different calls: alike in shape only",
	"cmd/hoplink/kube.go newOperatorCmd ~ cmd/hoplink/run.go newLocalCmd":   "two commands' runs of error checks after different calls: alike in shape only",
}

// generated is the line that marks a generated file (go help generate).
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// shipped says whether a package of the module ships: not hack/, e2e/ or
// what only tests use.
func shipped(rel string) bool {
	for _, p := range []string{"hack", "e2e", "internal/testing"} {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return false
		}
	}
	return true
}

// shapedLine is one line of a function, folded.
type shapedLine struct {
	shape uint64
	fn    string // "relay/x.go recv.Name"
	logic bool   // it starts with a keyword: if, for, switch, return, go, ...
}

func (t *tree) nearCopies() ([]copyPair, error) {
	var files [][]shapedLine
	for _, p := range t.ours("") {
		rel, _ := t.rel(p.ImportPath)
		if !shipped(rel) {
			continue
		}
		parsed, err := t.parsed(p)
		if err != nil {
			return nil, err
		}
		for _, f := range parsed {
			lines, err := t.shapes(f)
			if err != nil {
				return nil, err
			}
			files = append(files, lines)
		}
	}
	// Where each run of minLines lines stands: file, first line.
	type place struct{ file, at int }
	runs := map[uint64][]place{}
	for fi, lines := range files {
		for i := 0; i+minLines <= len(lines); i++ {
			if lines[i].fn != lines[i+minLines-1].fn || !logic(lines[i:i+minLines]) {
				continue
			}
			h := fnv.New64a()
			for _, l := range lines[i : i+minLines] {
				var b [8]byte
				for k := range 8 {
					b[k] = byte(l.shape >> (8 * k))
				}
				h.Write(b[:])
			}
			runs[h.Sum64()] = append(runs[h.Sum64()], place{fi, i})
		}
	}
	longest := map[[2]string]int{}
	for _, ps := range runs {
		if len(ps) < 2 || len(ps) > maxPlaces {
			continue
		}
		for i := range ps {
			for j := i + 1; j < len(ps); j++ {
				a, b := files[ps[i].file], files[ps[j].file]
				x, y := ps[i].at, ps[j].at
				if a[x].fn == b[y].fn {
					continue
				}
				n := 0 // how far the run goes on
				for x+n < len(a) && y+n < len(b) && a[x+n].shape == b[y+n].shape && a[x+n].fn == a[x].fn && b[y+n].fn == b[y].fn {
					n++
				}
				k := [2]string{a[x].fn, b[y].fn}
				if k[1] < k[0] {
					k[0], k[1] = k[1], k[0]
				}
				longest[k] = max(longest[k], n)
			}
		}
	}
	var out []copyPair
	for k, n := range longest {
		out = append(out, copyPair{k[0], k[1], n})
	}
	slices.SortFunc(out, func(p, q copyPair) int { return strings.Compare(p.A+p.B, q.A+q.B) })
	return out, nil
}

// logic says whether a run of lines decides anything: two of them start
// with a keyword. Runs of declarations (a command's flags, a package's
// metrics) share a shape by nature and are not counted.
func logic(run []shapedLine) bool {
	n := 0
	for _, l := range run {
		if l.logic {
			n++
		}
	}
	return n >= 2
}

// shapes folds the lines of f's function bodies, in order; a file that is
// generated has none.
func (t *tree) shapes(f *ast.File) ([]shapedLine, error) {
	name := t.fset.Position(f.Pos()).Filename
	src, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	if generated.Match(src) {
		return nil, nil
	}
	var out []shapedLine
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		fn := fd.Name.Name
		if fd.Recv != nil {
			fn = recvName(fd.Recv.List[0].Type) + "." + fn
		}
		fn = t.whereFile(name) + " " + fn
		start, end := t.fset.Position(fd.Body.Pos()).Offset, t.fset.Position(fd.Body.End()).Offset
		fs := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fs.AddFile("", -1, end-start), src[start:end], nil, 0)
		line, words, thin := 0, []string(nil), true
		var first token.Token
		flush := func() {
			if len(words) > 0 && !thin {
				h := fnv.New64a()
				h.Write([]byte(strings.Join(words, " ")))
				out = append(out, shapedLine{h.Sum64(), fn, first.IsKeyword()})
			}
			words, thin = nil, true
		}
		for {
			pos, tok, _ := s.Scan()
			if tok == token.EOF {
				break
			}
			if l := fs.Position(pos).Line; l != line {
				flush()
				line, first = l, tok
			}
			switch {
			case tok == token.SEMICOLON:
			case tok == token.IDENT:
				words, thin = append(words, "i"), false
			case tok.IsLiteral():
				words, thin = append(words, "l"), false
			default:
				words = append(words, tok.String())
				thin = thin && !tok.IsKeyword()
			}
		}
		flush()
	}
	return out, nil
}
