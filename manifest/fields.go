package manifest

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What the JSON decoder says of a bad duration or quantity names no field
// ("time: unknown unit"), and of an unknown field names no fix. These
// helpers walk an object's Go type along its JSON names to say both.

var (
	durationType = reflect.TypeFor[metav1.Duration]()
	quantityType = reflect.TypeFor[resource.Quantity]()
)

// checkScalars finds the durations and quantities in obj (an object
// decoded as JSON into maps) that do not parse, naming each by its path,
// before the strict decoder stops at the first without a name.
func checkScalars(t reflect.Type, v any, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		s, ok := v.(string)
		if !ok {
			return []error{fmt.Errorf("%s: want a duration string such as 500ms, 2s or 1m", path)}
		}
		if _, err := time.ParseDuration(s); err != nil {
			return []error{fmt.Errorf("%s: %q is not a duration; use a number with a unit, such as 500ms, 2s or 1m", path, s)}
		}
		return nil
	case t == quantityType:
		s := fmt.Sprint(v)
		if _, err := resource.ParseQuantity(s); err != nil {
			return []error{fmt.Errorf("%s: %q is not a quantity; use for example 100m, 64Mi or 2", path, s)}
		}
		return nil
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil // the decoder names a wrong type
		}
		for name, f := range jsonFields(t) {
			if fv, ok := m[name]; ok && fv != nil {
				errs = append(errs, checkScalars(f.Type, fv, join(path, name))...)
			}
		}
	case reflect.Slice:
		if l, ok := v.([]any); ok {
			for i, e := range l {
				errs = append(errs, checkScalars(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	case reflect.Map:
		if m, ok := v.(map[string]any); ok {
			for k, e := range m {
				errs = append(errs, checkScalars(t.Elem(), e, join(path, k))...)
			}
		}
	}
	return errs
}

// jsonFields are a struct type's fields by JSON name, embedded structs'
// (inline) included.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name == "" && f.Anonymous:
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for n, sf := range jsonFields(ft) {
					out[n] = sf
				}
			}
		case name != "":
			out[name] = f
		}
	}
	return out
}

// suggestField says which field an unknown one (a dotted path, as the
// strict decoder names it) was likely meant to be, or "".
func suggestField(t reflect.Type, path string) string {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return ""
		}
		p, _, _ = strings.Cut(p, "[")
		f, ok := jsonFields(t)[p]
		if !ok {
			return ""
		}
		t = f.Type
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return ""
	}
	var names []string
	for n := range jsonFields(t) {
		names = append(names, n)
	}
	best := closest(parts[len(parts)-1], names)
	if best == "" {
		return ""
	}
	return strings.Join(append(parts[:len(parts)-1:len(parts)-1], best), ".")
}

// closest is the name of names nearest to s by edit distance, when near
// enough to be a typo (at most a third of its length, and 2), else "".
func closest(s string, names []string) string {
	best, bestD := "", min(2, max(1, len(s)/3))+1
	for _, n := range names {
		d := editDistance(strings.ToLower(s), strings.ToLower(n))
		if d < bestD || d == bestD && n < best {
			best, bestD = n, d
		}
	}
	if bestD > min(2, max(1, len(s)/3)) {
		return ""
	}
	return best
}

// DidYouMean is `; did you mean "x"?` for the name of names nearest to s,
// or "".
func DidYouMean(s string, names []string) string {
	if c := closest(s, names); c != "" && c != s {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of neighbours that turn a into b (optimal string alignment): a swap is
// the commonest typo and costs one.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
