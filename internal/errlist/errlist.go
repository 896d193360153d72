// Package errlist joins errors for people to read: attempts that failed
// alike are said once, with how many there were.
package errlist

import (
	"errors"
	"fmt"
	"strings"
)

// Distinct joins errs on one line, each text once with how many times it
// came ("... refused (3 times)"). Spares dialled at once to a peer that is
// down, or traces of one route, fail alike: the line says so once. When
// every text differs it is errors.Join's, so errors.Is still sees each.
func Distinct(errs []error) error {
	var order []string
	count := map[string]int{}
	var kept []error
	for _, err := range errs {
		if err == nil {
			continue
		}
		kept = append(kept, err)
		s := err.Error()
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	switch {
	case len(kept) == 0:
		return nil
	case len(kept) == 1:
		return kept[0]
	case len(order) == len(kept):
		return errors.Join(kept...)
	}
	parts := make([]string, len(order))
	for i, s := range order {
		parts[i] = s
		if n := count[s]; n > 1 {
			parts[i] = fmt.Sprintf("%s (%d times)", s, n)
		}
	}
	return errors.New(strings.Join(parts, "; "))
}
