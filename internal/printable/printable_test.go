package printable

import (
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"relay hk: dial 10.0.0.1:80: connection refused", "relay hk: dial 10.0.0.1:80: connection refused"},
		{"µs, 東京, é", "µs, 東京, é"},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},                             // sets the terminal's title
		{"\x1b[2J\x1b[Hall chains ready", `\x1b[2J\x1b[Hall chains ready`},   // clears the screen
		{"ok\nready: every relay answers", `ok\nready: every relay answers`}, // a forged line
		{"a\tb\rc", `a\tb\rc`},
		{"\u009b31m", `\u009b31m`},         // C1 control sequence introducer
		{"abc\u202edcba", `abc\u202edcba`}, // right-to-left override
		{"\xff\xfe", `\xff\xfe`},           // not UTF-8
		{"\u00a0", `\u00a0`},               // a space that is not ' '
		{"\U000e0001", `\U000e0001`},       // a tag character
	} {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestStrings(t *testing.T) {
	type inner struct {
		Msg    string
		hidden string
	}
	type outer struct {
		Name  string
		Ptr   *inner
		List  []inner
		Names []string
		Map   map[string]string
		Any   any
		N     int
	}
	v := &outer{
		Name: "\x1b[2J", Ptr: &inner{Msg: "a\nb", hidden: "\x1b"},
		List: []inner{{Msg: "\x07"}}, Names: []string{"\x1b]0;t\x07"},
		Map: map[string]string{"k\x1b": "v\x1b"}, Any: &inner{Msg: "\x1b"}, N: 3,
	}
	Strings(v)
	if v.Name != `\x1b[2J` || v.Ptr.Msg != `a\nb` || v.List[0].Msg != `\x07` || v.Names[0] != `\x1b]0;t\x07` ||
		v.Map[`k\x1b`] != `v\x1b` || len(v.Map) != 1 || v.Any.(*inner).Msg != `\x1b` || v.N != 3 {
		t.Fatalf("%+v %+v %+v", v, v.Ptr, v.List)
	}
	if v.Ptr.hidden != "\x1b" {
		t.Error("an unexported field was changed")
	}
	Strings(nil)
	Strings((*outer)(nil))
}
