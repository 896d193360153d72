package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// small is a module with what each count must find and what it must not.
var small = map[string]string{
	"go.mod": "module example.test/m\n\ngo 1.22\n",
	"relay/a/a.go": `package a

import (
	cb "example.test/m/relay/b"
	"example.test/m/relay/b"
)

type Local func(int)

type Alias = Local

type S struct{ n int }

func (S) One()        {}
func (*S) Two()       {}
func (s *S) three()   {}
func Free()           {}
func (g G[T]) Get() T { var z T; return z }

type G[T any] struct{ v T }

type Options struct {
	OnA      func()
	OnB, OnC func(string) error
	L        Local
	Al       Alias
	Far      b.Callback
	Renamed  cb.Callback
	NotFunc  b.Plain
	Chan     chan func()
	hidden   func()
	Inner    struct{ OnD func() }
	Embedded
}

type Embedded struct{ OnE func() }

type private struct{ OnF func() }
`,
	"relay/b/b.go": `package b

type Callback Next

type Next func(string)

type Plain struct{}

type T struct{}

func (T) M() {}
`,
	"route/r.go": `package route

type R struct{}

func (R) A() {}
func (R) B() {}
`,
	"hack/h/h.go":         "package h\n",
	"hack/user/user.go":   "package user\n\nimport _ \"example.test/m/hack/h\"\n",
	"tool/tool.go":        "package tool\n",
	"tool/tool_test.go":   "package tool\n\nimport _ \"example.test/m/hack/h\"\n",
	"tool/x_test.go":      "package tool_test\n\nimport _ \"example.test/m/hack/h\"\n",
	"clean/clean.go":      "package clean\n\nimport _ \"example.test/m/relay/b\"\n",
	"clean/clean_test.go": "package clean\n",
}

func loadSmall(t *testing.T) *tree {
	t.Helper()
	dir := t.TempDir()
	for name, src := range small {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestCountsOnASmallModule(t *testing.T) {
	tr := loadSmall(t)

	ms, err := tr.methods("relay")
	if err != nil {
		t.Fatal(err)
	}
	want := []typeCount{{"relay/a.S", 3}, {"relay/a.G", 1}, {"relay/b.T", 1}}
	if !slices.Equal(ms, want) {
		t.Errorf("methods in relay/...: %v, want %v", ms, want)
	}
	if ms, _ := tr.methods("route"); !slices.Equal(ms, []typeCount{{"route.R", 2}}) {
		t.Errorf("methods in route/...: %v", ms)
	}

	cbs, err := tr.callbacks("relay")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cbs {
		names = append(names, c.Name)
	}
	wantNames := []string{"relay/a.Options.OnA", "relay/a.Options.OnB", "relay/a.Options.OnC", "relay/a.Options.L", "relay/a.Options.Al",
		"relay/a.Options.Far", "relay/a.Options.Renamed", "relay/a.Options.Inner.OnD", "relay/a.Embedded.OnE"}
	if !slices.Equal(names, wantNames) {
		t.Errorf("callbacks:\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(wantNames, "\n"))
	}

	his, err := tr.hackImports()
	if err != nil {
		t.Fatal(err)
	}
	wantHack := []hackImport{{"tool/tool_test.go", "hack/h"}, {"tool/x_test.go", "hack/h"}}
	if !slices.Equal(his, wantHack) {
		t.Errorf("imports of hack/: %v, want %v", his, wantHack)
	}

}

// TestTCPLegsWalkTheTree: a leg whose end a change no longer reaches from
// its start fails here, so the legs are kept up with the code. The tool
// runs as its own process, built without the race detector: SSA of the
// relay's packages under -race takes five times as long.
func TestTCPLegsWalkTheTree(t *testing.T) {
	cmd := exec.Command("go", "run", ".", "-C", "../..")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./hack/structure: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "Files a TCP flow crosses") {
		t.Errorf("no count of the files a flow crosses:\n%s", out)
	}
}

// flows is a module whose one flow crosses an interface and a goroutine,
// beside a second implementation of the interface that no value of it
// ever holds.
var flows = map[string]string{
	"go.mod": "module example.test/f\n\ngo 1.22\n",
	"relay/link/link.go": `package link

type Upper interface{ Hop(int) }
`,
	"relay/r.go": `package relay

import (
	"net"

	"example.test/f/relay/link"
)

type server struct{ up link.Upper }

func Run()                    { newServer().accept() }
func newServer() *server      { return &server{up: roles{}} }
func (s *server) accept()     { go func() { s.serve() }() }
func (s *server) serve()      { s.up.Hop(1) }

type roles struct{}

func (roles) Hop(int) { dial() }

type other struct{}

func (other) Hop(int) { dial() }

func dial() { d := &net.Dialer{}; d.Dial("tcp", "x") }
`,
}

func TestLegsOnASmallModule(t *testing.T) {
	dir := t.TempDir()
	for name, src := range flows {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tr.callGraph("relay")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := g.walk([]leg{{"exit", "relay.server.accept", "net.Dialer.Dial", "", "the target dialed"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []call{{"relay.server.accept", "relay/r.go"}, {"relay.server.serve", "relay/r.go"}, {"relay.roles.Hop", "relay/r.go"}, {"relay.dial", "relay/r.go"}}
	if !slices.Equal(ws[0].Calls, want) {
		t.Errorf("calls %v, want %v", ws[0].Calls, want)
	}
	if f, files := crossed(ws); f != 4 || files != 1 {
		t.Errorf("crossed %d functions in %d files, want 4 in 1", f, files)
	}
	for _, l := range []leg{
		{"exit", "relay.server.accept", "net.Dialer.Dial", "relay.other.Hop", "through a type no Upper holds"},
		{"exit", "relay.server.accept", "relay.gone", "", "to a function that is gone"},
		{"exit", "relay.gone", "net.Dialer.Dial", "", "from a function that is gone"},
		{"exit", "relay.dial", "relay.server.serve", "", "backwards"},
	} {
		if _, err := g.walk([]leg{l}); err == nil || !strings.Contains(err.Error(), "update tcpLegs") {
			t.Errorf("a leg %s: %v, want an error", l.What, err)
		}
	}
}

// copies is a module with one real near-copy (the same logic under other
// names, in two packages), a run of declarations that is alike by nature,
// a generated file and a test file that repeat it, and a copy under hack/.
var copies = map[string]string{
	"go.mod": "module example.test/c\n\ngo 1.22\n",
	"a/a.go": `package a

func Sum(xs []int, limit int) (int, bool) {
	total := 0
	for i, x := range xs {
		if x < 0 {
			continue
		}
		total += x
		if total > limit {
			return i, false
		}
	}
	return total, true
}

func Flags(set func(string, int)) {
	set("a", 1)
	set("b", 2)
	set("c", 3)
	set("d", 4)
	set("e", 5)
	set("f", 6)
	set("g", 7)
	set("h", 8)
}
`,
	"b/b.go": `package b

func Count(items []int, most int) (int, bool) {
	n := 0
	for j, it := range items {
		if it < 0 {
			continue
		}
		n += it
		if n > most {
			return j, false
		}
	}
	return n, true
}

func Options(put func(string, int)) {
	put("x", 1)
	put("y", 2)
	put("z", 3)
	put("w", 4)
	put("v", 5)
	put("u", 6)
	put("t", 7)
	put("s", 8)
}
`,
	"b/zz_generated.go": `// Code generated by hand for a test. DO NOT EDIT.

package b

func Gen(items []int, most int) (int, bool) {
	n := 0
	for j, it := range items {
		if it < 0 {
			continue
		}
		n += it
		if n > most {
			return j, false
		}
	}
	return n, true
}
`,
	"b/b_test.go": `package b

func again(items []int, most int) (int, bool) {
	n := 0
	for j, it := range items {
		if it < 0 {
			continue
		}
		n += it
		if n > most {
			return j, false
		}
	}
	return n, true
}
`,
	"hack/h/h.go": `package h

func Tool(items []int, most int) (int, bool) {
	n := 0
	for j, it := range items {
		if it < 0 {
			continue
		}
		n += it
		if n > most {
			return j, false
		}
	}
	return n, true
}
`,
}

func TestNearCopiesOnASmallModule(t *testing.T) {
	dir := t.TempDir()
	for name, src := range copies {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tr.nearCopies()
	if err != nil {
		t.Fatal(err)
	}
	want := []copyPair{{"a/a.go Sum", "b/b.go Count", 8}}
	if !slices.Equal(got, want) {
		t.Errorf("near-copies %v, want %v", got, want)
	}
}
