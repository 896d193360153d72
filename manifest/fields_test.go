package manifest

import "testing"

func TestClosest(t *testing.T) {
	names := []string{"entry", "exit", "via", "route", "mode", "maxHops", "transport"}
	for _, tc := range []struct{ in, want string }{
		{"entyr", "entry"}, // a swap
		{"ext", "exit"},    // a letter left out
		{"trasnport", "transport"},
		{"maxhops", "maxHops"}, // case
		{"colour", ""},         // nothing near
		{"x", ""},
		{"vai", "via"},
	} {
		if got := closest(tc.in, names); got != tc.want {
			t.Errorf("closest(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
