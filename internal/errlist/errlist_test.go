package errlist

import (
	"errors"
	"testing"
)

func TestDistinct(t *testing.T) {
	a, b := errors.New("a refused"), errors.New("b timed out")
	for _, tc := range []struct {
		name string
		errs []error
		want string
	}{
		{"none", nil, ""},
		{"nil only", []error{nil, nil}, ""},
		{"one", []error{a}, "a refused"},
		{"one beside nils", []error{nil, a, nil}, "a refused"},
		{"all alike", []error{a, a, a}, "a refused (3 times)"},
		{"some alike", []error{a, b, a}, "a refused (2 times); b timed out"},
		{"all differ", []error{a, b}, "a refused\nb timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Distinct(tc.errs)
			if got == nil && tc.want != "" || got != nil && got.Error() != tc.want {
				t.Errorf("Distinct = %v, want %q", got, tc.want)
			}
		})
	}
	if err := Distinct([]error{a, b}); !errors.Is(err, a) || !errors.Is(err, b) {
		t.Errorf("distinct errors lost their identity: %v", err)
	}
}
