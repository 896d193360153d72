package main

import (
	"os"
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

	if _, err := tr.locate([]step{{"", "relay/a", "S.Two", true}, {"", "relay/a", "Free", true}}); err != nil {
		t.Errorf("locate: %v", err)
	}
	for _, s := range []step{{"", "relay/a", "S.Gone", true}, {"", "relay/a", "Two", true}, {"", "relay/c", "Free", true}, {"", "relay/a", "G.Get", true}} {
		if _, err := tr.locate([]step{s}); (err == nil) != (s.Func == "G.Get") {
			t.Errorf("locate %s.%s: err %v", s.Pkg, s.Func, err)
		}
	}
}

// TestTCPPathIsInTheTree: a function of the TCP flow's path that moved or
// was renamed fails here, so the list is kept up with the code.
func TestTCPPathIsInTheTree(t *testing.T) {
	tr, err := load("../..")
	if err != nil {
		t.Fatal(err)
	}
	steps, err := tr.locate(tcpPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != len(tcpPath) {
		t.Fatalf("located %d of %d functions", len(steps), len(tcpPath))
	}
}
