// Package manifest reads RelayNode, Chain and Tunnel objects from YAML or
// JSON files and checks them as a whole: every reference resolves, every
// route is a real path, no two listeners collide. Local mode, standalone
// relays and the operator share it so that a manifest means the same thing
// everywhere.
package manifest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

// DefaultNamespace is the namespace of objects that do not name one.
const DefaultNamespace = "default"

// Source says where an object was read, for error messages.
type Source struct {
	File string
	Doc  int // 1-based document index within File
	// Line is the line of File before the document: its "---", or 0.
	Line int
}

func (s Source) String() string {
	if s.Doc > 1 {
		return fmt.Sprintf("%s (document %d)", s.File, s.Doc)
	}
	return s.File
}

// Load reads every manifest under the given files or directories (a
// directory contributes its *.yaml, *.yml and *.json files, not recursing)
// and validates the result. Objects of other API groups are skipped and
// listed in Set.Skipped, so a folder may also hold the Kubernetes objects of
// a demo.
func Load(paths ...string) (*Set, error) {
	s, err := Read(paths...)
	if err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// Read reads the manifests as Load does, without checking the objects or
// the references between them, and returns the objects it could decode
// with the errors of those it could not: for what lists names (shell
// completion) while the files are still being written.
func Read(paths ...string) (*Set, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
		var found []string
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					found = append(found, filepath.Join(p, e.Name()))
				}
			}
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("manifests: %s holds no .yaml, .yml or .json file", p)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	s := newSet()
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
		if err := s.decodeFile(f, data); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

// Parse reads manifests from memory, as Load does from a file named name.
func Parse(name string, data []byte) (*Set, error) {
	s := newSet()
	if err := s.decodeFile(name, data); err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Set) decodeFile(file string, data []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	seps := separatorLines(data)
	var errs []error
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if err == io.EOF {
			break
		}
		src := Source{File: file, Doc: doc}
		if doc > 1 && doc-2 < len(seps) {
			src.Line = seps[doc-2]
		}
		if err != nil {
			return fmt.Errorf("%s: not valid YAML: %s%s", src, src.fileLines(err), tabHint(data, src, err))
		}
		if err := s.decodeDoc(src, raw, data); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// separatorLines are the line numbers (1-based) of the "---" lines that
// split a file into documents, as the YAML reader splits it.
func separatorLines(data []byte) []int {
	var out []int
	for i, l := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(l, []byte("---")) && (len(l) == 3 || l[3] == ' ' || l[3] == '\r' || l[3] == '\t') {
			out = append(out, i+1)
		}
	}
	return out
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// fileLines turns a YAML error's line within the document into a line of
// the file.
func (s Source) fileLines(err error) string {
	return yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(m[len("line "):])
		return fmt.Sprintf("line %d", n+s.Line)
	})
}

// tabHint names the tab behind a YAML error: the parser says "found
// character that cannot start any token" of a line indented with one,
// which does not say what to change. It looks at the line the error
// names, then at the rest of the document.
func tabHint(file []byte, src Source, err error) string {
	lines := bytes.Split(file, []byte("\n"))
	indentedWithTab := func(n int) bool {
		if n < 1 || n > len(lines) {
			return false
		}
		l := lines[n-1]
		return bytes.IndexByte(l[:len(l)-len(bytes.TrimLeft(l, " \t"))], '\t') >= 0
	}
	hint := func(n int) string {
		return fmt.Sprintf("; line %d is indented with a tab: YAML indents with spaces only, so replace the tab with spaces", n)
	}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		if indentedWithTab(n + src.Line) {
			return hint(n + src.Line)
		}
	}
	for n := src.Line + 1; n <= len(lines); n++ {
		if n > src.Line+1 && bytes.HasPrefix(lines[n-1], []byte("---")) {
			break // the next document
		}
		if indentedWithTab(n) {
			return hint(n)
		}
	}
	return ""
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

func (s *Set) decodeDoc(src Source, raw, file []byte) error {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("%s: not valid YAML: %s%s", src, src.fileLines(err), tabHint(file, src, err))
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil // empty document, e.g. after a trailing "---"
	}
	var tm typeMeta
	if err := yaml.Unmarshal(js, &tm); err != nil {
		return fmt.Errorf("%s: not a Kubernetes object: %w", src, err)
	}
	group, version, _ := strings.Cut(tm.APIVersion, "/")
	ours := tm.Kind == "RelayNode" || tm.Kind == "Chain" || tm.Kind == "Tunnel"
	if group != v1alpha1.GroupVersion.Group {
		if ours {
			// A hoplink kind under another apiVersion is a mistake, not
			// another API's object to pass over.
			return fmt.Errorf("%s: %s %q: apiVersion %q: a %s is %s; set apiVersion: %s", src, tm.Kind, tm.Metadata.Name, tm.APIVersion, tm.Kind, v1alpha1.GroupVersion, v1alpha1.GroupVersion)
		}
		s.Skipped = append(s.Skipped, fmt.Sprintf("%s: %s %s %q", src, tm.APIVersion, tm.Kind, tm.Metadata.Name))
		return nil
	}
	if version != v1alpha1.GroupVersion.Version {
		return fmt.Errorf("%s: %s %q: apiVersion %q is not served; use %s", src, tm.Kind, tm.Metadata.Name, tm.APIVersion, v1alpha1.GroupVersion)
	}
	strict := func(obj any) error {
		where := fmt.Sprintf("%s: %s %q", src, tm.Kind, tm.Metadata.Name)
		var generic map[string]any
		if err := json.Unmarshal(js, &generic); err == nil {
			if errs := checkScalars(reflect.TypeOf(obj), generic, ""); len(errs) > 0 {
				return prefixed(where, errs)
			}
			if p, ok := explicitZeroPort(tm.Kind, generic); ok {
				return fmt.Errorf("%s: %s: 0 is out of range; use 1-65535, or leave it out for %d", where, p, v1alpha1.DefaultRelayPort)
			}
		}
		// sigs.k8s.io/json names the full path of an unknown or duplicate
		// field ("spec.entyr"), which encoding/json does not.
		strictErrs, err := kjson.UnmarshalStrict(js, obj)
		if err != nil {
			return fmt.Errorf("%s: %s", where, cleanDecodeError(err))
		}
		if len(strictErrs) > 0 {
			for i, e := range strictErrs {
				if m := unknownField.FindStringSubmatch(e.Error()); m != nil {
					if f := suggestField(reflect.TypeOf(obj), m[1]); f != "" {
						strictErrs[i] = fmt.Errorf("%w; did you mean %q?", e, f)
					}
				}
			}
			return prefixed(where, strictErrs)
		}
		return nil
	}
	switch tm.Kind {
	case "RelayNode":
		o := &v1alpha1.RelayNode{}
		if err := strict(o); err != nil {
			return err
		}
		return s.add(src, o)
	case "Chain":
		o := &v1alpha1.Chain{}
		if err := strict(o); err != nil {
			return err
		}
		return s.add(src, o)
	case "Tunnel":
		o := &v1alpha1.Tunnel{}
		if err := strict(o); err != nil {
			return err
		}
		return s.add(src, o)
	default:
		return fmt.Errorf("%s: kind %q is not a %s kind; use RelayNode, Chain or Tunnel", src, tm.Kind, v1alpha1.GroupVersion.Group)
	}
}

var unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)

// prefixed is errs, each after where.
func prefixed(where string, errs []error) error {
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = fmt.Errorf("%s: %s", where, cleanDecodeError(e))
	}
	return errors.Join(out...)
}

// explicitZeroPort finds a RelayNode's spec.listen.port written as 0,
// which decoding cannot tell from one left out (the default).
func explicitZeroPort(kind string, obj map[string]any) (string, bool) {
	if kind != "RelayNode" {
		return "", false
	}
	spec, _ := obj["spec"].(map[string]any)
	listen, _ := spec["listen"].(map[string]any)
	if p, ok := listen["port"].(float64); ok && p == 0 {
		return "spec.listen.port", true
	}
	return "", false
}

var typeErr = regexp.MustCompile(`cannot unmarshal (\w+) into Go struct field \w+\.(\S+) of type (\S+)`)

// cleanDecodeError drops the decoder's layers of "error unmarshaling JSON:"
// so the user sees which field is wrong and nothing else.
func cleanDecodeError(err error) string {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return typeErr.ReplaceAllString(msg, "$2: got a $1, want $3")
}
