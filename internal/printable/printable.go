// Package printable makes text from elsewhere (a relay's answers, a
// condition anyone with status access may write) safe to show on a
// terminal or copy into a condition: every character that is not
// printable is written as an escape, so no control sequence reaches a
// terminal (no title set, no screen cleared, no line rewritten), no
// newline forges a row of a table, and no bidirectional override reorders
// what a reader sees.
package printable

import (
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with each character that is not printable (controls,
// format characters, invalid UTF-8, spaces other than ' ') as a Go escape:
// \x1b, \n, \u202e, \xff.
func String(s string) string {
	if isPrintable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

func isPrintable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Strings makes every string that v points to printable, in place: the
// exported fields of structs, the elements of slices and arrays, the keys
// and values of maps, through pointers and interfaces.
func Strings(v any) {
	walk(reflect.ValueOf(v))
}

func walk(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walk(v.Elem())
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(String(v.String()))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				walk(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walk(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() {
			return
		}
		iter := v.MapRange()
		type kv struct{ k, v reflect.Value }
		var all []kv
		for iter.Next() {
			all = append(all, kv{iter.Key(), iter.Value()})
		}
		for _, e := range all {
			k, val := reflect.New(e.k.Type()).Elem(), reflect.New(e.v.Type()).Elem()
			k.Set(e.k)
			val.Set(e.v)
			walk(k)
			walk(val)
			v.SetMapIndex(e.k, reflect.Value{})
			v.SetMapIndex(k, val)
		}
	}
}
